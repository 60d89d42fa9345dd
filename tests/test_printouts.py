"""Graph-diff printouts (``str(RewriteResult)``), the debug environment variable and logging."""

from __future__ import annotations

import functools
import io
import logging
import operator
import re

import pytest
import torch

import fxviews
from fxviews.examples import push_jvp
from fxviews.passes import Record, RecordKind
from fxviews.passes.graph_edits import describe_call
from fxviews.rewriting.printouts import (
    DEBUG_ENV,
    debug_enabled,
    format_diff,
    format_result,
    format_summary,
    format_table,
    report_rewrite,
)


def windows_and_outside(x, head):
    # One as_strided the engine synthesizes (sliding windows), one it must keep: it reads
    # element 4, past the end of its input, the 4-element head of a longer buffer.
    return x.as_strided((4, 3), (1, 1)) * 1, head.as_strided((3,), (2,), 0) * 1


@pytest.fixture(scope="module")
def seed_result():
    return fxviews.explain(push_jvp, torch.randn(4, 6), torch.randn(4, 6), torch.randn(4, 6))


@pytest.fixture(scope="module")
def mixed_result():
    return fxviews.explain(windows_and_outside, torch.randn(8), torch.randn(8)[:4])


def fake_result(records, *, code_before="def forward(self):\n    return ()", seconds=0.0021):
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    return fxviews.RewriteResult(
        graph_module=gm,
        records=records,
        modified=bool(records),
        code_before=code_before,
        seconds=seconds,
    )


AS_STRIDED, VIEW = RecordKind.AS_STRIDED, RecordKind.VIEW
LONG = "as_strided(" + ", ".join(f"clone_{i}" for i in range(30)) + ", [6, 6, 6], [36, 6, 1], 0)"
RECORDS = [
    Record(
        "as_strided",
        "as_strided(clone_1, [6], [1], 0)",
        "select(clone_1, 0, 0)",
        "provenance",
        "replays select",
        kind=AS_STRIDED,
    ),
    Record(
        "as_strided_1",
        LONG,
        "unfold(unfold(x, 0, 2, 1), 1, 2, 1)",
        "synthesized",
        "a chain of view ops " * 8,
        kind=AS_STRIDED,
    ),
    Record(
        "as_strided_2",
        "as_strided(t, [2, 3], [3, 1], 0)",
        "t",
        "identity",
        "same geometry",
        kind=AS_STRIDED,
    ),
    Record(
        "as_strided_3",
        "as_strided(buf, [6], [1], 0)",
        "select(view, 0, 0)",
        "scatter",
        "relative to the base view",
        kind=AS_STRIDED,
    ),
    Record(
        "as_strided_4",
        "as_strided(x, [3], [1], 0)",
        "as_strided(x, [3], [1], 0)",
        "kept",
        "exposes memory its input does not",
        kind=AS_STRIDED,
    ),
]


def test_seed_printout_has_table_summary_and_diff(seed_result):
    text = str(seed_result)
    assert text == format_result(seed_result)
    header = text.splitlines()[0].split()
    assert header == ["node", "before", "after", "method"]
    assert "reason: replays the graph's own view ops" in text  # under its row
    assert "provenance" in text and "select(clone_1, 0, 0)" in text
    assert "as_strided 1 rewritten (provenance 1), 0 kept" in text
    assert "--- before" in text and "+++ after" in text
    removed = [line for line in text.splitlines() if line.startswith("-") and "as_strided" in line]
    added = [line for line in text.splitlines() if line.startswith("+") and "select" in line]
    assert removed and added
    # FX's `name = None` bookkeeping is noise in a diff.
    assert "= None" not in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_kept_and_synthesized_rows(mixed_result):
    methods = [r.method for r in mixed_result.records]
    assert sorted(methods) == ["kept", "synthesized"]
    text = str(mixed_result)
    rows = [line for line in text.splitlines() if line.startswith("as_strided")]
    assert len(rows) == 3  # both nodes, and the pinning step's row for the kept one
    assert "as_strided 1 rewritten (synthesized 1), 1 kept" in text
    assert "layout-bound node 0 rewritten, 1 kept" in text  # it reads a graph input
    kept = next(row for row in columns(format_table(mixed_result.records)) if row[3] == "kept")
    assert "reads storage address 4" in kept[4]  # why the node was kept
    assert "unfold" in text


def test_table_has_one_row_per_record_and_fits_the_width():
    for width in (100, 80, 60):
        table = format_table(RECORDS, width=width)
        lines = table.splitlines()
        assert max(len(line) for line in lines) <= width, (width, table)
        starts = [line.split()[0] for line in lines[2:] if line and not line.startswith(" ")]
        assert starts == [r.node for r in RECORDS]
        for record in RECORDS:
            assert record.method in table


def column_spans(table: str) -> list[tuple[int, int]]:
    """Where each column of a printout table starts and ends, from its dashes."""
    dashes_line = table.splitlines()[1]
    spans, start = [], 0
    for dashes in dashes_line.split("  "):
        start = dashes_line.index(dashes, start)
        spans.append((start, start + len(dashes)))
        start += len(dashes)
    return spans


def row_lines(table: str) -> list[tuple[list[str], list[str]]]:
    """Per row of a printout table: its lines of cells, and the lines of the reason under it."""
    start = column_spans(table)[1][0]
    rows: list[tuple[list[str], list[str]]] = []
    for line in table.splitlines()[2:]:
        if line[:1].strip():  # a node name: a new row
            rows.append(([line], []))
        elif line[start:].startswith("reason: ") or rows[-1][1]:
            rows[-1][1].append(line[start:])
        else:
            rows[-1][0].append(line)
    return rows


def columns(table: str) -> list[list[str]]:
    """The cells of a printout table, wrapped lines joined, then the reason: one list per row."""
    spans = column_spans(table)
    rows = []
    for cell_lines, reason_lines in row_lines(table):
        cells = [" ".join(line[a:b].strip() for line in cell_lines).strip() for a, b in spans]
        reason = " ".join(line.strip() for line in reason_lines).removeprefix("reason: ")
        rows.append([*cells, reason])
    return rows


@pytest.mark.parametrize("width", [100, 72])
def test_wrapped_cells_lose_nothing(width):
    rows = columns(format_table(RECORDS, width=width))
    for row, record in zip(rows, RECORDS, strict=True):
        expected = [record.node, record.before, record.after, record.method, record.reason]
        assert ["".join(cell.split()) for cell in row] == ["".join(e.split()) for e in expected]


FEATURE_META = "_new_zeros_with_same_feature_meta"  # a name forward AD gives its buffers


def column_lines(table: str, column: int) -> list[str]:
    """The lines of one column of a one-row table, as wrapped (the reason under it left out)."""
    start, end = column_spans(table)[column]
    [(cell_lines, _)] = row_lines(table)
    return [line[start:end].strip() for line in cell_lines]


def feature_meta_record() -> Record:
    return Record(
        "as_strided",
        f"as_strided({FEATURE_META}, [6], [1], 0)",
        f"select({FEATURE_META}, 0, 0)",
        "provenance",
        "replays the view " * 4,
        kind=AS_STRIDED,
    )


def test_cells_wrap_at_token_boundaries_not_inside_identifiers():
    table = format_table([feature_meta_record()], width=100)
    # Both cells are wrapped, in columns wide enough for the identifier: it stays whole.
    assert column_lines(table, 1)[:3] == ["as_strided(", f"{FEATURE_META},", "[6], [1], 0)"]
    assert column_lines(table, 2)[:3] == ["select(", f"{FEATURE_META}, 0,", "0)"]
    assert max(len(line) for line in table.splitlines()) <= 100


@pytest.mark.parametrize("width", [96, 100, 104])
def test_identifiers_that_fit_their_column_stay_whole(width):
    table = format_table([feature_meta_record()], width=width)
    for column in (1, 2):
        lines = column_lines(table, column)
        assert len([line for line in lines if line]) > 1, table  # wrapped
        assert any(FEATURE_META in line for line in lines), table


def test_an_identifier_wider_than_its_column_is_split_on_lines_of_its_own():
    table = format_table([feature_meta_record()], width=80)
    before = [line for line in column_lines(table, 1) if line]
    start, end = column_spans(table)[1]
    assert end - start < len(FEATURE_META)
    # The call's name is not filled up with the identifier's first letters; nothing is lost.
    assert before[0] == "as_strided("
    assert "".join(before).replace(" ", "") == f"as_strided({FEATURE_META},[6],[1],0)"
    assert all(len(line) <= end - start for line in before)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["x", 0, 1, 2**63 - 1], "slice(x, 0, 1)"),  # x[1:]
        (["x", 0, 1, 2**63 - 1, 1], "slice(x, 0, 1)"),
        (["x", 0, 1, 2**63 - 1, 2], "slice(x, 0, 1, None, 2)"),  # x[1::2]
        (["x", 1, 0, 4], "slice(x, 1, 0, 4)"),
        (["x", 1, 0, 4, 2], "slice(x, 1, 0, 4, 2)"),
    ],
)
def test_a_slice_to_the_end_is_written_without_its_end(args, expected):
    assert describe_call(torch.ops.aten.slice.Tensor, args) == expected


def test_node_descriptions_name_nodes_and_index_getitem():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    assert describe_call(torch.ops.aten.select.int, [x, 0, 2]) == "select(x, 0, 2)"
    assert describe_call(operator.getitem, [x, 1]) == "x[1]"


def test_records_of_a_real_graph_show_slices_as_written():
    def view_from_the_second_row(x, y):
        x = x.clone()
        view = x[1:]
        x.copy_(y)  # forward AD hands `view` its tangent through as_strided
        return view, x

    def push(x, y, yt):
        return torch.func.jvp(functools.partial(view_from_the_second_row, x), (y,), (yt,))

    result = fxviews.explain(push, *torch.randn(3, 4, 6).unbind())
    [record] = result.records
    assert record.method == "provenance"
    assert record.after == "slice(clone_1, 0, 1)"
    assert str(2**63 - 1) not in format_table(result.records)


def test_summary_counts_each_method():
    summary = format_summary(fake_result(RECORDS))
    assert summary == (
        "fxviews: as_strided 4 rewritten (provenance 1, synthesized 1, identity 1, scatter 1), "
        "1 kept; in 2.1 ms"
    )


def test_summary_groups_records_by_kind_of_node():
    records = RECORDS[:2] + [
        Record(
            "view", "view(clone, [-1])", "reshape(clone, [-1])", "reshape", "no alias", kind=VIEW
        ),
        Record("view_1", "view(x, [6])", "", "kept", "aliasing is observable", kind=VIEW),
    ]
    assert format_summary(fake_result(records)) == (
        "fxviews: as_strided 2 rewritten (provenance 1, synthesized 1), 0 kept; "
        "view 1 rewritten (reshape 1), 1 kept; in 2.1 ms"
    )


def test_summary_without_as_strided():
    expected = "fxviews: no as_strided nodes, graph unchanged; in 2.1 ms"
    assert format_summary(fake_result([])) == expected
    result = fxviews.rewrite(fxviews.trace(lambda x: x * 2, torch.ones(2)))
    text = str(result)
    assert "no as_strided nodes" in text and "(graph code unchanged)" in text
    assert not text.startswith("node")  # no empty table


def test_diff_folds_long_lines_and_keeps_markers():
    before = "def forward(self, x):\n    y = f(" + ", ".join(["x"] * 60) + ")\n    return y\n"
    after = "def forward(self, x):\n    return x\n"
    diff = format_diff(before, after, width=60)
    lines = diff.splitlines()
    assert max(len(line) for line in lines) <= 60
    folded = [line for line in lines if line.startswith("-") and "x" in line]
    assert len(folded) > 2  # one long removed line became several, all marked as removed
    assert "".join(line[1:] for line in folded).count("x") == 60


@pytest.mark.parametrize("width", [60, 72, 100])
def test_diff_lines_wrap_at_token_boundaries_not_inside_identifiers(width):
    call = f"torch.ops.aten.as_strided.default({FEATURE_META}, [6], [1], 0)"
    long_line = f"    as_strided_with_a_long_name = {call}; {FEATURE_META} = None"
    before = f"def forward(self, {FEATURE_META}):\n{long_line}\n    return as_strided\n"
    after = f"def forward(self, {FEATURE_META}):\n    return as_strided\n"
    lines = format_diff(before, after, width=width).splitlines()
    assert max(len(line) for line in lines) <= width
    removed = [line[1:] for line in lines if line.startswith("-    ") or line.startswith("-  ")]
    assert len(removed) > 1  # the one removed line, wrapped
    identifiers = re.findall(r"[A-Za-z_][\w.]*", call)
    for identifier in identifiers:  # each one whole on one line
        assert any(identifier in line for line in removed), (identifier, removed)
    statement = long_line.split(";")[0]
    assert "".join(removed).replace(" ", "") == statement.replace(" ", "")  # nothing lost


def test_diff_ignores_release_bookkeeping():
    before = "def forward(self, x):\n    a = g(x);  x = None\n    return a\n"
    after = "def forward(self, x):\n    a = g(x)\n    return a\n"
    assert format_diff(before, after) == "(graph code unchanged)"


@pytest.mark.parametrize(
    "value, enabled",
    [("1", True), ("true", True), ("ON", True), ("0", False), ("", False), ("no", False)],
)
def test_debug_enabled(monkeypatch, value, enabled):
    monkeypatch.setenv(DEBUG_ENV, value)
    assert debug_enabled() is enabled


def test_report_rewrite_prints_only_when_asked(monkeypatch, seed_result):
    stream = io.StringIO()
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    report_rewrite(seed_result, source="unit", stream=stream)
    assert stream.getvalue() == ""
    monkeypatch.setenv(DEBUG_ENV, "1")
    report_rewrite(seed_result, source="unit", stream=stream)
    printed = stream.getvalue()
    assert printed.startswith("=== fxviews rewrite: unit ===") and "+++ after" in printed


def test_report_rewrite_skips_graphs_with_nothing_to_show(monkeypatch):
    monkeypatch.setenv(DEBUG_ENV, "1")
    stream = io.StringIO()
    report_rewrite(fake_result([]), source="unit", stream=stream)
    assert stream.getvalue() == ""


def test_report_rewrite_logs_every_record_at_debug(caplog):
    result = fake_result(RECORDS)
    with caplog.at_level(logging.DEBUG, logger="fxviews"):
        report_rewrite(result, source="unit")
    messages = [r.getMessage() for r in caplog.records if r.name == "fxviews"]
    for record in RECORDS:
        assert any(record.node + ":" in m and f"[{record.method}]" in m for m in messages)
    assert all(r.levelno == logging.DEBUG for r in caplog.records if r.name == "fxviews")
    assert any("as_strided 4 rewritten" in m for m in messages)


def test_printout_shows_the_reshape_step_of_a_real_graph():
    def flatten_then_scale(x):
        return x.clone().view(-1) * 2

    result = fxviews.rewrite(fxviews.trace(flatten_then_scale, torch.ones(2, 3)))
    assert [r.method for r in result.view_records] == ["reshape"]
    text = str(result)
    assert "reshape(clone, [-1])" in text
    assert "view 1 rewritten (reshape 1), 0 kept" in text
    assert "+    reshape_default = torch.ops.aten.reshape.default(clone, [-1])" in text


def test_repr_is_the_summary_not_a_dataclass_dump():
    from fxviews.examples import push_jvp, seed_args

    result = fxviews.explain(push_jvp, *seed_args())
    shown = repr(result)
    assert shown.startswith("<RewriteResult fxviews: as_strided 1 rewritten (provenance 1)")
    assert "graph_module=" not in shown and "print()" in shown
