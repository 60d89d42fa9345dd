"""Smoke test of ``fxviews bench``: the quick run prints every table and writes its JSON.

The output's shape is checked (titles, headers, one line per measured case, JSON keys), and
that every measured path ran: a path that raises fails the run. Timings depend on the machine
and its load, so no test ever asserts one.
"""

from __future__ import annotations

import json

import pytest

from fxviews import bench

# Rows that each trace one small function and compile nothing: seconds, not tens of seconds.
FAST_ROWS = ("vmap", "graph", "overhead")


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``--quick`` tinier still: one repeat, short loops, a 1k-node graph only."""
    monkeypatch.setattr(bench, "QUICK", bench.Settings(1, 0.0, (8, 64), (1_000,), 1, False))


def test_quick_bench_prints_every_table_and_writes_json(tiny, tmp_path, capsys) -> None:
    out_path = tmp_path / "bench.json"
    assert bench.main(["--quick", "--json", str(out_path)]) == 0
    printed = capsys.readouterr().out

    # One title per row, in order, each followed by its table.
    positions = [printed.index(bench.BENCHES[row][0]) for row in bench.ROWS]
    assert positions == sorted(positions)
    for header in (
        "loop/graph",
        "eager_vmap/graph",
        "rewritten/original",
        "first_call_s",
        "pass_us_per_node",
        "pass/trace",
        "tf/graph",
        "fxviews/aot_eager",
    ):
        assert header in printed

    assert bench.FAILED not in printed  # every measured path ran
    report = json.loads(out_path.read_text())
    assert set(report) == {"meta", "rows"}
    assert {"torch", "threads", "quick", "date"} <= set(report["meta"])
    assert report["meta"]["threads"] == 1 and report["meta"]["quick"] is True
    rows = report["rows"]
    assert list(rows) == list(bench.ROWS)
    assert [line["B"] for line in rows["vmap"]] == [8, 64]
    assert {"loop_s", "eager_vmap_s", "graph_vmap_s", "transform_vmap_s"} <= set(rows["vmap"][0])
    assert len(rows["graph"]) == 2 and len(rows["pass_cost"]) == 1
    assert [line["path"] for line in rows["first_call"]][0] == "fxviews.transform"
    # Inductor is left out of --quick, and says so instead of printing a number.
    assert rows["first_call"][-1]["first_call_s"] is None
    assert "quick" in rows["first_call"][-1]["note"]
    assert len(rows["compile"]) == 2
    assert all(isinstance(line["nodes"], int) and line["nodes"] > 0 for line in rows["pass_cost"])


def test_rows_flag_selects_rows_and_rejects_unknown_ones(tiny, capsys) -> None:
    assert bench.main(["--quick", "--rows", ",".join(FAST_ROWS)]) == 0
    printed = capsys.readouterr().out
    assert bench.BENCHES["vmap"][0] in printed
    assert bench.BENCHES["pass_cost"][0] not in printed

    assert bench.main(["--rows", "vmap,nope"]) == 2
    assert "nope" in capsys.readouterr().out


def test_a_measured_path_that_raises_fails_the_run(tiny, capsys, monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("backend exploded")

    monkeypatch.setattr(bench, "first_call_seconds", broken)
    assert bench.main(["--quick", "--rows", "first_call"]) == 1
    printed = capsys.readouterr().out
    assert "measured paths failed" in printed
    assert "first_call: n/a (error: RuntimeError: backend exploded)" in printed
