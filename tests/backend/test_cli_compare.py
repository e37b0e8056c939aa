"""``onnx-quant run --compare``: the user's model as given is compared (never the session's
rewritten one), with an oracle that is exact on any host CPU, one line naming it."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnx_quant import exported_models, model_zoo, oracles
from onnx_quant.cli import main


def _save(model, tmp_path, name):
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def models():
    logging.getLogger().setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {form: model_zoo.quantized("cnn", form, blocks=1, channels=4) for form in ("qoperator", "qdq")}


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("exact", [True, False])
def test_auto_compares_a_u8s8_model_exactly_on_either_kind_of_cpu(gpu, capsys, tmp_path, models, monkeypatch, exact):
    """The QOperator CNN (QLinearConv, QGemm over int8 weights): auto compares with onnxruntime
    on its widened model (exact on any CPU), so the GPU's output is identical on either kind of
    host, and one line names the oracle and what this CPU would have done."""
    monkeypatch.setattr(oracles, "host_u8s8_exact", lambda: exact)
    path = _save(models["qoperator"], tmp_path, "cnn_qop")
    code, out, err = run_cli(capsys, "run", path, "--random", "--compare")
    assert code == 0, out + err
    lines = [line for line in out.splitlines() if line.startswith("compare: oracle")]
    assert len(lines) == 1
    assert lines[0].startswith("compare: oracle onnxruntime-u8u8: onnxruntime CPU with the int8 weight sides")
    assert ("saturates their sums" in lines[0]) is not exact
    assert "identical" in out


def test_a_planted_rewrite_bug_is_caught(gpu, capsys, tmp_path, models, monkeypatch):
    """A QDQ fusion that writes a wrong output scale into one fused node: --compare runs the
    oracle on the user's QDQ model, so the GPU's changed result shows as a difference (comparing
    the rewritten model, as before, both sides would carry the bug and agree)."""
    from onnx_quant.backend_wgpu import qdq_fusion

    real = qdq_fusion.fuse_qdq

    def buggy(model, **kw):
        result = real(model, **kw)
        node = next(n for n in result.model.graph.node if n.op_type == "QLinearConv")
        init = next(t for t in result.model.graph.initializer if t.name == node.input[6])
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(1.5), init.name))
        return result

    path = _save(models["qdq"], tmp_path, "cnn_qdq")
    code, out, _ = run_cli(capsys, "run", path, "--random", "--compare", "auto")
    assert code == 0 and "identical" in out  # the real fusion: exact
    monkeypatch.setattr(qdq_fusion, "fuse_qdq", buggy)
    code, out, _ = run_cli(capsys, "run", path, "--random", "--compare", "auto")
    assert code == 1 and "elements differ" in out


@pytest.mark.parametrize("engine", ["onnxruntime", "reference"])
def test_float_models_with_fused_ops_compare_without_a_crash(gpu, capsys, tmp_path, engine):
    """A float MobileNetV3 as torch.onnx writes it: the session fuses Conv + HardSwish and
    elementwise chains into ai.onnx_quant ops that no oracle knows; the oracle runs the model as
    given, so the comparison runs and agrees within the float tolerance."""
    model = exported_models.build("mobilenet_v3", "float")
    model = exported_models.fix_inputs(model, exported_models.MODELS["mobilenet_v3"][1])
    path = _save(model, tmp_path, "mobilenet")
    code, out, err = run_cli(capsys, "run", path, "--random", "--compare", engine)
    assert "is not a registered function/op" not in out + err
    assert code == 0, out + err
    assert f"compare: oracle {engine}:" in out
