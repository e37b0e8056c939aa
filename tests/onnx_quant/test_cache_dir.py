"""The one cache root: where it lives, its per-version folders, and clearing it."""

from onnx_quant import __version__, cache_dir


def test_root_follows_env_then_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv(cache_dir.ENV, str(tmp_path / "mine"))
    assert cache_dir.root() == tmp_path / "mine"
    monkeypatch.delenv(cache_dir.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir.root() == tmp_path / "xdg" / "onnx-quant"


def test_folder_is_per_version_and_clear_keeps_wheels(monkeypatch, tmp_path):
    monkeypatch.setenv(cache_dir.ENV, str(tmp_path))
    plans = cache_dir.folder("plans")
    assert plans == tmp_path / "plans" / __version__ and plans.is_dir()
    (plans / "x").write_text("1")
    cache_dir.folder("tuning")
    (tmp_path / "wheels").mkdir()
    assert sorted(p.name for p in cache_dir.clear("plans")) == ["plans"]
    assert not (tmp_path / "plans").exists() and (tmp_path / "tuning").exists()
    assert [p.name for p in cache_dir.clear()] == ["tuning"]
    assert (tmp_path / "wheels").is_dir()
