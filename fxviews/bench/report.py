"""How the bench reports: measured-or-failed cells, units, ratios and the printed tables."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

from tabulate import tabulate

from fxviews.bench.settings import Table
from fxviews.passes.device_faults import current_accelerator, raise_if_device_failed

#: How a note starts when the path it measures raised: the run then exits with status 1.
FAILED = "n/a (error: "


def measured(measure: Callable[[], float]) -> tuple[float | None, str]:
    """``(measure(), "")``, or ``(None, "n/a (error: ...)")`` when the path measured fails here.

    A path that raises (a backend bug, a missing feature of this torch) becomes an ``n/a``
    cell with the reason and the other rows still run, but the run fails (see :func:`run`).
    An error that leaves the accelerator unusable ends the run instead: nothing measured on it
    afterwards would be true (Note [A device error is fatal] in fxviews.passes.device_faults).
    """
    try:
        return measure(), ""
    except Exception as err:  # noqa: BLE001 - reported in its cell, and fails the run
        raise_if_device_failed(err, current_accelerator(), "a measured path")
        return None, f"{FAILED}{why(err)}"[:118] + ")"


def why(err: BaseException) -> str:
    """``"Type: first line of the message"``, for a cell saying why a path did not run."""
    from fxviews.tracing.failures import first_line

    return f"{type(err).__name__}: {first_line(err)}"


def failed_paths(tables: dict[str, Table]) -> list[str]:
    """``"row: note"`` for every line whose measured path raised."""
    return [
        f"{row}: {line['note']}"
        for row, table in tables.items()
        for line in table
        if FAILED in str(line.get("note", ""))
    ]


def fmt_seconds(seconds: float | None) -> str:
    """A time with a unit a reader compares at a glance (differences may be negative)."""
    if seconds is None:
        return "n/a"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "n/a"
    return f"{ratio:,.0f}x" if abs(ratio) >= 1000 else f"{ratio:.3g}x"  # 1,510x, not 1.51e+03x


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def above(seconds: float | None, floor: float | None) -> float | None:
    """``seconds - floor``: what a call costs above a floor both include (None if unknown)."""
    return None if seconds is None or floor is None else seconds - floor


def render(table: Table) -> str:
    """A tabulate table: ``*_s`` columns as times, ratio columns (``a/b``) as ``Nx``."""

    def cell(key: str, value: Any) -> Any:
        if key.endswith("_s"):
            return fmt_seconds(value)
        if "/" in key or key.startswith("vs_"):
            return fmt_ratio(value)
        if isinstance(value, float):
            return f"{value:.3g}"
        return value

    # Columns with nothing to say in any line (an empty note) are left out of the printout.
    keys = [k for k in table[0] if any(line[k] not in ("", None) for line in table)]
    headers = [header(k) for k in keys]
    notes: dict[str, str] = {}  # a long note's text -> its mark, "[1]"...
    rows = [
        [_footnoted(line[k], notes) if k == "note" else cell(k, line[k]) for k in keys]
        for line in table
    ]
    printed = tabulate(rows, headers=headers)
    for text, mark in notes.items():
        printed += "\n" + textwrap.fill(f"{mark} {text}", WIDTH, subsequent_indent="    ")
    return printed


#: The width the bench's printout keeps within.
WIDTH = 100
#: Notes longer than this are printed under the table, marked in their cell.
_NOTE_IN_CELL = 40


def _footnoted(note: str, notes: dict[str, str]) -> str:
    """``note`` as its cell shows it: itself if short, else its mark (see :func:`render`)."""
    if len(note) <= _NOTE_IN_CELL:
        return note
    return notes.setdefault(note, f"[{len(notes) + 1}]")


def header(key: str) -> str:
    """A column's printed header: within ~100 columns a table of ten keeps its names whole.

    Times carry their unit in each cell, so ``_s`` goes; a long ratio ``a/b`` is printed over two
    lines, ``a/`` above ``b``.

    Example::

        >>> header("eager_vmap/graph")
        'eager_vmap/\ngraph'
    """
    key = SHORT_HEADERS.get(key, key).removesuffix("_s")
    if "/" in key and len(key) > 7 and "\n" not in key:
        numerator, denominator = key.split("/", 1)
        return f"{numerator}/\n{denominator}"
    return key


#: Printed names of row 1's and row 5's columns (their JSON keys stay as they are).
SHORT_HEADERS = {
    "eager_vmap_s": "eager",
    "graph_vmap_s": "graph",
    "transform_vmap_s": "tf",
    "vmap_floor_s": "floor",
    "eager_vmap/graph": "eager/graph",
    "transform/graph": "tf/graph",
    "eager/tf_over_floor": "eager/tf\nover floor",
    "flat_graph_s": "flat graph",
    "overhead_s": "tf - graph",
    "overhead_flat_s": "tf - flat\ngraph",
    "tree_cost_s": "graph - flat\ngraph",
}
#: Printed names of rows 6 and 7's first-call columns: the wall and CPU time of one compile.
SHORT_HEADERS.update(
    {
        "aot_eager_s": "aot_eager\nwall",
        "fxviews_s": "fxviews\nwall",
        "aot_eager_cpu_s": "aot_eager\ncpu",
        "fxviews_cpu_s": "fxviews\ncpu",
        "fxviews/aot_eager": "fxviews/\naot_eager\n(cpu)",
        "cpu_range": "range\n(cpu)",
        "first_cpu_s": "first\ncpu",
        "first/inductor": "first/\ninductor\n(cpu)",
    }
)
#: Printed names of row 8's columns: first calls in CPU time, fxviews' share of transform's.
SHORT_HEADERS.update(
    {
        "program": "prog",
        "eager_first_s": "eager\nfirst",
        "tf_first_s": "tf\nfirst",
        "tf/eager first": "tf/\neager\nfirst",
        "in_vmap_tf-eager_s": "in vmap:\ntf -\neager",
        "share_%": "fxviews\nshare %",
        "aot/eager first": "aot/\neager\nfirst",
        "tf/eager": "tf/\neager",
        "aot/eager": "aot/\neager",
    }
)

#: Printed names of row 12's columns.
SHORT_HEADERS.update({"eager_s": "eager", "tf_s": "tf"})
#: Printed names of row 13's columns: steady states, and ratios of steady states and of first
#: compiles (CPU time).
SHORT_HEADERS.update(
    {
        "inductor_steady_s": "inductor\nsteady",
        "aot_eager_steady_s": "aot_eager\nsteady",
        "steady fx/inductor": "steady\nfx/\ninductor",
        "first fx/inductor": "first\nfx/\ninductor",
        "steady fx/aot_eager": "steady\nfx/\naot_eager",
        "first fx/aot_eager": "first\nfx/\naot_eager",
    }
)

#: What a column means where its header cannot say it: printed under every table that has it.
LEGENDS = {
    "vmap_floor_s": "floor: vmap of a function that returns its inputs, the cost every vmap "
    "call pays whatever it computes; 'over floor' is a time minus it",
    "share_%": "fxviews share %: the part of transform's first call spent in fxviews' own "
    "rewrite and code generation",
}


def legend(table: Table) -> list[str]:
    """The :data:`LEGENDS` lines of the columns ``table`` prints."""
    printed = {key for line in table for key, value in line.items() if value not in ("", None)}
    return [text for key, text in LEGENDS.items() if key in printed]
