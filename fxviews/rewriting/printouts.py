"""Graph-diff printouts and logging for rewrites.

``str(fxviews.rewrite(gm))`` calls :func:`format_result`: a table with one row per as_strided
node (its reason under it), a summary line, and a unified diff of the graph code.
:func:`report_rewrite` is what :func:`fxviews.transform` and the ``torch.compile`` backend call
on every graph they rewrite: it logs each record to ``logging.getLogger("fxviews")`` at DEBUG
and, when the environment variable ``FXVIEWS_DEBUG`` is set to ``1``, prints the whole printout
to stderr.

Example::

    >>> res = fxviews.explain(push_jvp, x, y, yt)
    >>> print(res)                       # table, summary, diff
    >>> print(format_result(res, width=80, diff=False))
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol, TextIO

from fxviews.passes.schema import FAKE_MODE, RECORDED

if TYPE_CHECKING:  # the records are imported with the engine, not with the command line
    from fxviews.passes import Record

__all__ = [
    "all_records",
    "debug_enabled",
    "DEBUG_ENV",
    "fold",
    "format_diff",
    "format_result",
    "format_summary",
    "format_table",
    "logger",
    "report_rewrite",
    "Rewrite",
]

#: The logger every fxviews component writes to.
logger = logging.getLogger("fxviews")


#: Environment variable that makes :func:`report_rewrite` print every rewrite it sees.
DEBUG_ENV = "FXVIEWS_DEBUG"

#: Default printout width: a terminal 100 columns wide shows every line without wrapping.
DEFAULT_WIDTH = 100

_HEADERS = ("node", "before", "after", "method")
# Two spaces between columns and nothing at the edges.
_COLUMN_GAP = 2
# How each record's reason starts, on its own line(s) under its row.
_REASON = "reason: "
#: Under the reason: where the node came from in the user's code, padded to the reason's indent.
_SOURCE = "at:".ljust(len(_REASON))
# Where table cells may break: after a comma, an opening parenthesis or a space. Each match is
# one token, ending where a line may end.
_BREAK = re.compile(r"[^\s,(]*(?:,\s*|\(|\s+|$)")
# FX appends `;  a = b = None` to free intermediates early. The list of names changes whenever
# a node gains or loses its last user, so it turns unchanged lines into diff noise.
_FREE_SUFFIX = re.compile(r";\s+(?:[A-Za-z_]\w*\s*=\s*)+None\s*$")


class Rewrite(Protocol):
    """What the printouts read of a rewrite; :class:`fxviews.RewriteResult` is one.

    A protocol, not the class itself, so that this module does not import
    :mod:`fxviews.rewriting`, which imports it to print its results.
    """

    records: list[Record]
    view_records: list[Record]
    pin_records: list[Record]
    clone_records: list[Record]
    unfold_records: list[Record]
    modified: bool
    seconds: float
    traced_with: str | None
    autograd_kept: tuple[str, ...]
    code_before: str

    @property
    def code_after(self) -> str: ...


def format_result(result: Rewrite, *, width: int = DEFAULT_WIDTH, diff: bool = True) -> str:
    """The full printout of a :class:`~fxviews.RewriteResult`: table, summary line, code diff.

    Every line fits in ``width`` columns, 60 or more (long cells and long code lines are
    wrapped, never cut). ``diff=False`` leaves out the code diff.

    Example::

        >>> print(format_result(fxviews.explain(push_jvp, x, y, yt), width=80))
    """
    parts = []
    records = all_records(result)
    if records:
        parts.append(format_table(records, width=width))
    parts.append(_fold_summary(format_summary(result), width))
    if result.traced_with and result.traced_with not in (FAKE_MODE, RECORDED):
        parts.append(f"fxviews: traced in {result.traced_with}")
    if result.autograd_kept:
        kept = [
            folded
            for line in result.autograd_kept
            for folded in _wrap_tokens(f"  {line}", width, "      ")
        ]
        parts.append("\n".join(["fxviews: kept for autograd (run as eager runs them):", *kept]))
    if diff:
        parts.append(format_diff(result.code_before, result.code_after, width=width))
    return "\n\n".join(parts)


def format_table(records: Sequence[Record], *, width: int = DEFAULT_WIDTH) -> str:
    """A table of ``records``, one row per node with its reason under it, at most ``width`` wide.

    The columns are the node, its code before and after, and the method; the reason, often a
    sentence, gets a line of its own under the row (``reason:``), as wide as the table, so it
    reads as prose instead of a narrow column, and so does the user's source line that made the
    node where the trace recorded one (``at:``).

    Example::

        >>> print(format_table([Record("as_strided", "as_strided(t, [6], [1], 0)",
        ...                            "select(t, 0, 0)", "provenance", "twin view")]))
        node        before                      after            method
        ----------  --------------------------  ---------------  ----------
        as_strided  as_strided(t, [6], [1], 0)  select(t, 0, 0)  provenance
                    reason: twin view
    """
    rows = [[r.node, r.before, r.after, r.method] for r in records]
    natural = [max([len(header)] + [_widest_line(row[i]) for row in rows]) for i, header in
               enumerate(_HEADERS)]  # fmt: skip
    node, before, after, method = natural
    budget = width - _COLUMN_GAP * (len(_HEADERS) - 1) - node - method
    # Node names and methods are short identifiers: never wrapped. The code columns share the
    # rest, each at least as wide as its longest name where both fit (no name split mid-word).
    longest = [max([len(h)] + [_longest_token(row[i]) for row in rows]) for i, h in
               [(1, _HEADERS[1]), (2, _HEADERS[2])]]  # fmt: skip
    minimums = longest if sum(longest) <= budget else [len(_HEADERS[1]), len(_HEADERS[2])]
    widths = [node, *_fit_columns([before, after], minimums, budget), method]
    indent = " " * (node + _COLUMN_GAP)
    lines = [
        _joined(_HEADERS, widths),
        _joined(["-" * w for w in widths], widths),
    ]
    for record, row in zip(records, rows, strict=True):
        cells = [_wrap_cell(c, w).splitlines() or [""] for c, w in zip(row, widths, strict=True)]
        for i in range(max(len(cell) for cell in cells)):
            lines.append(_joined([cell[i] if i < len(cell) else "" for cell in cells], widths))
        notes = [f"{_REASON}{record.reason}"]
        if record.source is not None:
            notes.append(f"{_SOURCE}{record.source}")
        for note in notes:
            wrapped = _wrap_tokens(note, width - len(indent), " " * len(_REASON))
            lines += [indent + line for line in wrapped]
    return "\n".join(lines)


def _joined(cells: Sequence[str], widths: Sequence[int]) -> str:
    """One table line: ``cells`` padded to ``widths``, ``_COLUMN_GAP`` spaces apart."""
    gap = " " * _COLUMN_GAP
    return gap.join(cell.ljust(w) for cell, w in zip(cells, widths, strict=True)).rstrip()


def _longest_token(text: str) -> int:
    """The widest piece of ``text`` a cell never breaks (see _BREAK), trailing spaces aside."""
    return max((len(token.rstrip()) for token in _BREAK.findall(text)), default=0)


def format_summary(result: Rewrite) -> str:
    """One line: per kind of node, how many were rewritten (by method) and kept; the time.

    Example::

        >>> format_summary(res)
        'fxviews: as_strided 1 rewritten (provenance 1), 0 kept; in 2.1 ms'
    """
    from fxviews.passes import METHODS, RecordKind

    elapsed = f"in {result.seconds * 1e3:.1f} ms"
    records = all_records(result)
    if not records:
        changed = "graph cleaned up" if result.modified else "graph unchanged"
        return f"fxviews: no as_strided nodes, {changed}; {elapsed}"
    by_kind: dict[RecordKind, Counter[str]] = {kind: Counter() for kind in RecordKind}
    for record in records:
        by_kind[record.kind][record.method] += 1
    parts = []
    for kind, counts in by_kind.items():
        if not counts:
            continue
        kept = counts.pop("kept", 0)
        by_method = ", ".join(f"{m} {counts[m]}" for m in METHODS if counts.get(m))
        detail = f" ({by_method})" if by_method else ""
        parts.append(f"{kind.value} {sum(counts.values())} rewritten{detail}, {kept} kept")
    return "fxviews: " + "; ".join(parts) + f"; {elapsed}"


def format_diff(
    code_before: str,
    code_after: str,
    *,
    width: int = DEFAULT_WIDTH,
    context: int = 2,
) -> str:
    """A unified diff of two graph codes, with FX's ``x = None`` bookkeeping removed.

    Lines longer than ``width`` are wrapped; continuation lines repeat the diff marker so the
    printout still reads as a diff.

    Example::

        >>> print(format_diff(res.code_before, res.code_after))
    """
    before = _diffable_lines(code_before)
    after = _diffable_lines(code_after)
    lines = list(difflib.unified_diff(before, after, "before", "after", n=context, lineterm=""))
    if not lines:
        return "(graph code unchanged)"
    out: list[str] = []
    for line in lines:
        out.extend(_fold_diff_line(line, width))
    return "\n".join(out)


def fold(text: str, width: int) -> str:
    """``text`` with every line longer than ``width`` wrapped at token boundaries; continuation
    lines are indented four columns past the line they continue (at most half the width).

    Example::

        >>> print(fold("    y = f(alpha, beta)  # a comment", 20))
            y = f(alpha,
                beta)  # a
                comment
    """
    out = []
    for line in text.split("\n"):
        indent = len(line) - len(line.lstrip())
        continuation = " " * min(indent + 4, width // 2)
        out += _wrap_tokens(line, width, continuation) if len(line) > width else [line]
    return "\n".join(out)


def all_records(result: Rewrite) -> list[Record]:
    """Every record of ``result``, step by step: as_strided, copied unfolds, views, pins,
    overwritten clones.

    Example::

        >>> [r.kind.value for r in all_records(fxviews.explain(push_jvp, x, y, yt))]
        ['as_strided', 'overwritten clone']
    """
    return [
        *result.records,
        *result.unfold_records,
        *result.view_records,
        *result.pin_records,
        *result.clone_records,
    ]


def debug_enabled() -> bool:
    """Whether ``FXVIEWS_DEBUG`` asks for printouts (``1``, ``true``, ``yes`` or ``on``).

    Read on every call, so setting the variable at run time takes effect.
    """
    return os.environ.get(DEBUG_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def report_rewrite(
    result: Rewrite,
    *,
    source: str,
    stream: TextIO | None = None,
) -> None:
    """Log every record of ``result`` at DEBUG; with ``FXVIEWS_DEBUG=1`` also print its diff.

    ``source`` says who rewrote the graph (e.g. ``"transform(f)"`` or ``"backend"``); it starts
    every log message and the printout's header. The printout goes to ``stream`` (default
    stderr) and only for graphs that held as_strided nodes or changed, so a debug run is not
    flooded with empty reports.

    Example::

        >>> report_rewrite(fxviews.rewrite(gm), source="my_compiler")
    """
    records = all_records(result)
    for record in records:
        logger.debug(
            "%s: %s: %s -> %s [%s] %s",
            source,
            record.node if record.source is None else f"{record.node} at {record.source}",
            record.before,
            record.after,
            record.method,
            record.reason,
        )
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("%s: %s", source, format_summary(result))
    if debug_enabled() and (records or result.modified):
        stream = sys.stderr if stream is None else stream
        print(f"=== fxviews rewrite: {source} ===\n{format_result(result)}\n", file=stream)


def _widest_line(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def _fit_columns(natural: Sequence[int], minimums: Sequence[int], budget: int) -> list[int]:
    """Column widths summing to at most ``budget`` where possible: narrow columns keep their
    natural width, the rest share what is left equally (water filling), none below its
    minimum."""
    widths = list(natural)
    if sum(widths) <= budget:
        return widths
    open_columns = set(range(len(widths)))
    remaining = budget
    while open_columns:
        share = remaining // len(open_columns)
        fitting = {i for i in open_columns if natural[i] <= share}
        if not fitting:
            for i in open_columns:
                widths[i] = max(share, minimums[i])
            break
        for i in fitting:
            widths[i] = natural[i]
            remaining -= natural[i]
        open_columns -= fitting
    return widths


def _wrap_cell(text: str, width: int) -> str:
    """``text`` in lines of at most ``width``, broken at token boundaries (see _BREAK)."""
    lines: list[str] = []
    for line in text.splitlines() or [""]:
        lines.extend(_wrap_tokens(line, width))
    return "\n".join(lines)


def _wrap_tokens(line: str, width: int, indent: str = "") -> list[str]:
    """``line`` in lines of at most ``width``, broken at token boundaries (see _BREAK); lines
    after the first start with ``indent`` (shorter than ``width``)."""
    # Greedy filling by tokens; a token is split only when it alone is wider than a line.
    lines: list[str] = []
    current = ""
    for token in _BREAK.findall(line):
        if len((current + token).rstrip()) <= width:
            current += token
            continue
        if current.strip():
            lines.append(current.rstrip())
            current = indent + token.lstrip()
        else:  # only leading space so far: the token starts the line
            current += token
        while len(current.rstrip()) > width:
            lines.append(current[:width])
            current = indent + current[width:]
    return [*lines, current.rstrip()] if current.strip() or not lines else lines


def _fold_summary(summary: str, width: int) -> str:
    """The summary line in lines of at most ``width``, broken after a kind's ``;`` (a kind's
    counts stay on one line where they fit); continuation lines are indented."""
    pieces = summary.split("; ")
    lines = [pieces[0]]
    for piece in pieces[1:]:
        lines[-1] += ";"
        if len(f"{lines[-1]} {piece}") <= width:
            lines[-1] += f" {piece}"
        else:
            lines.append(f"    {piece}")
    return "\n".join(folded for line in lines for folded in _wrap_tokens(line, width, "    "))


def _diffable_lines(code: str) -> list[str]:
    return [_FREE_SUFFIX.sub("", line).rstrip() for line in code.strip().splitlines()]


def _fold_diff_line(line: str, width: int) -> Iterable[str]:
    if len(line) <= width:
        return [line]
    marker, body = line[:1], line[1:]
    indent = len(body) - len(body.lstrip())
    # Continuations keep the marker (the printout still reads as a diff) and indent four
    # columns past the line they continue, like hand-wrapped Python (at most half the line).
    continuation = " " * min(indent + 4, (width - 1) // 2)
    return [marker + piece for piece in _wrap_tokens(body, width - 1, continuation)]
