"""``python -m fxviews bench --plot DIR``: PNG charts of the bench's tables.

Two charts, each written only when the rows it draws ran:

- ``vmap.png`` (rows ``vmap`` and ``compiled``): time per call against batch size for the
  per-sample loop, eager ``vmap``, ``vmap`` of the rewritten graph, ``vmap(transform)`` and
  vmap's floor; the compiled paths as points at the batch size they were measured at.
- ``pass_cost.png`` (row ``pass_cost``): pass time and make_fx trace time against graph size.

matplotlib is an optional dependency (``pip install 'fxviews[bench]'``); :func:`require_matplotlib`
says so before the bench spends minutes measuring.

Example::

    >>> tables = bench.run_rows(["vmap"], bench.QUICK, None)
    >>> write_charts(tables, "charts")
    ['charts/vmap.png']
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["require_matplotlib", "write_charts"]

#: The vmap row's series: JSON key and label.
VMAP_SERIES = {
    "loop_s": "per-sample loop",
    "eager_vmap_s": "eager vmap",
    "graph_vmap_s": "vmap(rewritten graph)",
    "transform_vmap_s": "vmap(transform)",
    "vmap_floor_s": "vmap floor (returns its inputs)",
}


def require_matplotlib() -> None:
    """Raise an ImportError naming the extra to install when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise ImportError(
            "fxviews bench --plot needs matplotlib: pip install 'fxviews[bench]'"
        ) from err


def write_charts(tables: dict[str, list[dict[str, Any]]], directory: str) -> list[str]:
    """Write the charts ``tables`` hold data for into ``directory``; return their paths."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    written = []
    if "vmap" in tables:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        batches = [line["B"] for line in tables["vmap"]]
        for key, label in VMAP_SERIES.items():
            points = [(b, line[key]) for b, line in zip(batches, tables["vmap"], strict=True)]
            points = [(b, t * 1e6) for b, t in points if t is not None]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=label)
        # The compiled paths sit within a few us of each other at one batch size: a legend
        # entry each (a marker of its own) stays readable where labels beside them overlapped.
        compiled_markers = iter("xP*Dv^")
        for line in tables.get("compiled", []):
            if line["steady_s"] is not None and line["path"] != "vmap(transform)":
                ax.scatter([line["B"]], [line["steady_s"] * 1e6],
                           marker=next(compiled_markers, "x"), s=50,
                           label=f"torch.compile: {line['path']}")  # fmt: skip
        ax.set(xscale="log", yscale="log", xlabel="batch size B", ylabel="time per call (us)")
        ax.set_title("vmap of push_jvp: time per call")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        written.append(_save(fig, directory, "vmap.png"))
    if "pass_cost" in tables:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for graph in dict.fromkeys(line.get("graph", "many_views") for line in tables["pass_cost"]):
            lines = [
                line for line in tables["pass_cost"] if line.get("graph", "many_views") == graph
            ]
            nodes = [line["nodes"] for line in lines]
            ax.plot(nodes, [line["pass_s"] for line in lines], marker="o",
                    label=f"fxviews.rewrite, {graph}")  # fmt: skip
            ax.plot(nodes, [line["trace_s"] for line in lines], marker="s", linestyle="--",
                    label=f"make_fx trace, {graph}")  # fmt: skip
        ax.set(xscale="log", yscale="log", xlabel="graph nodes", ylabel="seconds")
        ax.set_title("pass time vs graph size")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        written.append(_save(fig, directory, "pass_cost.png"))
    return written


def _save(fig: Any, directory: str, name: str) -> str:
    import matplotlib.pyplot as plt

    path = os.path.join(directory, name)
    fig.tight_layout()
    fig.savefig(path, dpi=80)  # small files: the charts are committed next to BENCHMARKS.md
    plt.close(fig)
    return path
