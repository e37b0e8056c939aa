"""PNG plots beside the benchmark tables (matplotlib, the ``bench`` extra: never a runtime
dependency). Each function takes the rows a benchmark already prints and writes one PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence


def _pyplot():
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        raise SystemExit("plots need matplotlib: pip install -e '.[bench]'") from None
    return plt


def grouped_bars(path: str | Path, title: str, categories: Sequence[str], series: dict[str, Sequence[float | None]],
                 ylabel: str, *, log: bool = False) -> str:
    """One group of bars per category, one bar per series (None: no bar)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(categories) + 2), 4.2), dpi=110)
    width = 0.8 / max(1, len(series))
    for k, (name, values) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(categories))]
        pts = [(x, v) for x, v in zip(xs, values) if v is not None]
        ax.bar([x for x, _ in pts], [v for _, v in pts], width, label=name)
    ax.set_xticks(range(len(categories)), categories, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, plt, path)


def lines(path: str | Path, title: str, series: dict[str, tuple[Sequence[float], Sequence[float | None]]],
          xlabel: str, ylabel: str, *, logx: bool = False, logy: bool = False) -> str:
    """One line per series: name -> (xs, ys); None ys are left out."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for name, (xs, ys) in series.items():
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
        if pts:
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, plt, path)


def _save(fig: Any, plt: Any, path: str | Path) -> str:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)
