"""Smoke test of ``fxviews bench``: the quick run prints every table and writes its JSON.

The output's shape is checked (titles, headers, one line per measured case, JSON keys), and
that every measured path ran: a path that raises fails the run. Timings depend on the machine
and its load, so no test ever asserts one.
"""

from __future__ import annotations

import json
import sys
import warnings

import pytest
import torch

import fxviews
from fxviews import bench
from fxviews.bench import (
    cli,
    cold,
    report,
    rows_compile,
    rows_models,
    rows_runtime,
    settings,
    timing,
    workloads,
    zoo,
)
from fxviews.bench.models import MODELS
from fxviews.examples import push_jvp, seed_args
from fxviews.passes.device_faults import DeviceFailure
from tests.real_models import require_zoo_or_skip

# Rows that each trace one small function and compile nothing: seconds, not tens of seconds.
FAST_ROWS = ("vmap", "graph", "overhead")


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``--quick`` tinier still: one repeat, short loops, a 1k-node graph only."""
    monkeypatch.setattr(
        cli,
        "QUICK",
        settings.Settings(
            1,
            0.0,
            (8, 64),
            (1_000,),
            1,
            False,
            dense_views=20,
            models=("mobilenet",),
            memory_mb=8,
            small_programs=("rotary", "q_value"),
            compiled_models=("toeplitz",),
        ),
    )


def test_quick_bench_prints_every_table_and_writes_json(tiny, tmp_path, capsys) -> None:
    out_path = tmp_path / "bench.json"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert bench.main(["--quick", "--json", str(out_path)]) == 0
    printed = capsys.readouterr().out
    # Cold compiles disable Dynamo's caches on purpose: its warning about that stays out.
    assert not [w for w in caught if "dynamo_pgo" in str(w.message)]
    assert "dynamo_pgo" not in printed  # nor among the warnings a row collects and summarizes

    # One title per row, in order, each followed by its table.
    positions = [printed.index(cli.title(row, cli.QUICK)) for row in bench.ROWS]
    assert positions == sorted(positions)
    for header in (
        "loop/",  # ratio headers print over two lines: "loop/" above "graph"
        "eager/",
        "rewritten/",
        "first_call",
        "pass_us_per_node",
        "pass/",
        "tf/",
        "tf - flat",
        "graph - flat",
        "fxviews/",
        "break_even",
    ):
        assert header in printed

    assert report.FAILED not in printed  # every measured path ran
    written = json.loads(out_path.read_text())
    assert set(written) == {"meta", "rows"}
    assert {"torch", "threads", "quick", "date"} <= set(written["meta"])
    assert written["meta"]["threads"] == 1 and written["meta"]["quick"] is True
    rows = written["rows"]
    assert list(rows) == list(bench.ROWS)
    assert [line["B"] for line in rows["vmap"]] == [8, 64]
    assert {"loop_s", "eager_vmap_s", "graph_vmap_s", "transform_vmap_s"} <= set(rows["vmap"][0])
    assert len(rows["graph"]) == 2
    assert [line["graph"] for line in rows["pass_cost"]] == ["many_views", "dense_views"]
    assert rows["pass_cost"][1]["as_strided"] == 20
    assert [line["path"] for line in rows["first_call"]][0] == "fxviews.transform"
    # Inductor is left out of --quick, and says so instead of printing a number.
    assert rows["first_call"][-1]["first_call_s"] is None
    assert "quick" in rows["first_call"][-1]["note"]
    # Row 5: the cached call against its graph returning fn's tree and a flat list, called
    # directly and under vmap, every path measured and the differences consistent with them.
    overhead = rows["overhead"]
    modules = len(list(rows_runtime.guarded_model().modules()))
    assert [line["call"] for line in overhead] == [
        "direct",
        f"vmap, B={rows_runtime.OVERHEAD_BATCH}",
        f"{modules} modules",
    ]
    module_line = overhead.pop()  # a transformed module beside its graph: no tree variants
    assert module_line["overhead_s"] == module_line["tf_s"] - module_line["graph_s"] > -1e-3
    for line in overhead:
        assert all(line[k] > 0 for k in ("tf_s", "graph_s", "flat_graph_s"))
        assert line["overhead_s"] == line["tf_s"] - line["graph_s"]
        assert line["overhead_flat_s"] == line["tf_s"] - line["flat_graph_s"]
        assert line["tree_cost_s"] == line["graph_s"] - line["flat_graph_s"]
    assert len(rows["compile"]) == 2
    # Row 6 reports CPU time, and the part of the fxviews compile spent in fxviews' rewrite.
    for line in rows["compile"]:
        assert 0 < line["engine_s"] < line["fxviews_cpu_s"] and line["aot_eager_cpu_s"] > 0
    # Row 7: the transform and the compiled paths that run without Inductor are measured, the
    # Inductor ones say they were skipped; each compiled path that ran has a break-even.
    compiled = {line["path"]: line for line in rows["compiled"]}
    assert list(compiled) == ["vmap(transform)", "aot_eager", "fxviews (eager)", "inductor",
                              "fxviews (inductor)"]  # fmt: skip
    for path in ("vmap(transform)", "aot_eager", "fxviews (eager)"):
        assert compiled[path]["steady_s"] > 0 and compiled[path]["first_call_s"] > 0
        assert compiled[path]["first_cpu_s"] > 0
    assert compiled["aot_eager"]["engine_s"] is None  # runs no fxviews
    assert compiled["fxviews (eager)"]["engine_s"] > 0
    assert compiled["aot_eager"]["break_even"] not in ("", "(base)")
    assert compiled["inductor"]["steady_s"] is None and "quick" in compiled["inductor"]["note"]
    # Row 8: each program of the model measured on every path that runs it, then the medians.
    models = rows["models"]
    assert [(line["model"], line["program"]) for line in models] == [
        ("mobilenet", "grads"),
        ("mobilenet", "jvp"),
        ("median", ""),
    ]
    for line in models[:-1]:
        assert line["tf_first_s"] > 0 and line["eager_first_s"] > 0 and line["tf/eager"] > 0
        assert 0 < line["share_%"] < 100
        assert (line["aot/eager first"] is None) == ("aot: n/a" in line["note"])
    steady = [line["tf/eager"] for line in models[:-1]]
    assert models[-1]["tf/eager"] == pytest.approx(sum(steady) / 2)  # the median of two
    # Row 12: each small program on both paths, then the median and the largest ratio.
    small = rows["small"]
    assert [line["program"] for line in small] == ["rotary", "q_value", "median", "largest"]
    for line in small[:2]:
        assert all(line[k] > 0 for k in ("eager_s", "tf_s", "eager_first_s", "tf_first_s"))
        assert line["tf/eager"] == line["tf_s"] / line["eager_s"]
        # Timed inside one vmap call: each path's part of a whole vmap call of it.
        assert -line["eager_s"] < line["in_vmap_tf-eager_s"] < line["tf_s"]
    assert small[3]["tf/eager"] == max(line["tf/eager"] for line in small[:2])
    inside = [line["in_vmap_tf-eager_s"] for line in small[:2]]
    assert small[2]["in_vmap_tf-eager_s"] == pytest.approx(sum(inside) / 2)  # the median of two
    # Row 13: the model in eval and trained, then the median and the worst ratio; Inductor
    # is left out of --quick, so only the ratios to aot_eager are measured.
    compiled_models = rows["compiled_models"]
    assert [(line["model"], line["program"]) for line in compiled_models] == [
        ("toeplitz", "eval"),
        ("toeplitz", "train"),
        ("median", ""),
        ("worst", ""),
    ]
    for line in compiled_models[:2]:
        assert line["steady fx/aot_eager"] > 0 and line["first fx/aot_eager"] > 0
        assert line["inductor_steady_s"] is None and line["steady fx/inductor"] is None
    ratios = [line["steady fx/aot_eager"] for line in compiled_models[:2]]
    assert compiled_models[3]["steady fx/aot_eager"] == max(ratios)
    assert compiled_models[2]["steady fx/aot_eager"] == pytest.approx(sum(ratios) / 2)
    assert max(len(line) for line in printed.splitlines()) <= 100, "tables within 100 columns"
    assert all(isinstance(line["nodes"], int) and line["nodes"] > 0 for line in rows["pass_cost"])


def test_rows_flag_selects_rows_and_rejects_unknown_ones(tiny, capsys) -> None:
    assert bench.main(["--quick", "--rows", ",".join(FAST_ROWS)]) == 0
    printed = capsys.readouterr().out
    assert cli.title("vmap", cli.QUICK) in printed
    assert cli.title("pass_cost", cli.QUICK) not in printed

    assert bench.main(["--rows", "vmap,nope"]) == 2
    assert "nope" in capsys.readouterr().out


def test_a_measured_path_that_raises_fails_the_run(tiny, capsys, monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("backend exploded")

    monkeypatch.setattr(rows_compile, "first_call_seconds", broken)
    assert bench.main(["--quick", "--rows", "first_call"]) == 1
    printed = capsys.readouterr().out
    assert "measured paths failed" in printed
    assert "first_call: n/a (error: RuntimeError: backend exploded)" in printed


def test_row_8_says_why_a_zoo_model_cannot_run(monkeypatch, capsys) -> None:
    monkeypatch.setattr(zoo, "unavailable", lambda library: f"{library} not installed")
    quick = settings.Settings(1, 0.0, (8,), (1_000,), 1, False, models=("mobilenet", "vit_tiny"))
    tables = bench.run_rows(["models"], quick, None)
    assert "n/a (timm not installed)" in capsys.readouterr().out
    assert report.failed_paths(tables) == []  # a missing extra is no failure of the run
    lines = {(line["model"], line["program"]): line for line in tables["models"]}
    assert list(lines)[2:] == [("vit_tiny", "grads"), ("vit_tiny", "jvp"), ("median", "")]
    assert lines["vit_tiny", "jvp"]["tf_first_s"] is None
    assert lines["median", ""]["tf/eager"] == pytest.approx(
        (lines["mobilenet", "grads"]["tf/eager"] + lines["mobilenet", "jvp"]["tf/eager"]) / 2
    )


def test_row_8_measures_the_zoo(capsys) -> None:
    """The bench's zoo rows run where the real-model tests do (``FXVIEWS_REQUIRE_ZOO=1`` in CI):
    every zoo program measured on every path that can capture it, at a tiny image side."""
    require_zoo_or_skip("torchvision", "timm")
    zoo_models = tuple(name for name, spec in MODELS.items() if spec.library)
    tiny_zoo = settings.Settings(1, 0.0, (8,), (1_000,), 1, False, models=zoo_models,
                                 zoo_image_side=32)  # fmt: skip
    tables = bench.run_rows(["models"], tiny_zoo, None)
    assert "n/a (" not in capsys.readouterr().out  # every library imported
    assert report.failed_paths(tables) == []
    *lines, median = tables["models"]
    assert [(line["model"], line["program"]) for line in lines] == [
        (name, kind) for name in zoo_models for kind in MODELS[name].programs
    ]
    for line in lines:
        assert line["tf_first_s"] > 0 and line["eager_first_s"] > 0 and line["tf/eager"] > 0
        assert 0 < line["share_%"] < 100
    assert median["model"] == "median" and median["tf/eager"] > 0


def test_row_8_medians_are_by_group_when_written_and_zoo_models_ran() -> None:
    def line(model: str, first: float) -> dict[str, object]:
        return rows_models._unmeasured(model, "grads", "") | {"tf_first_s": 1.0, "share_%": first}

    table = [line("vit", 1.0), line("resnet", 3.0), line("resnet18", 10.0), line("vit_tiny", 20.0)]
    medians = {m["model"]: m["share_%"] for m in rows_models._medians(table)}
    assert medians == {"median (written)": 2.0, "median (zoo)": 15.0, "median (all)": 6.5}


def test_break_even_counts_the_calls_a_compile_needs_to_pay_for_itself() -> None:
    # 10 s more up front, 90 us less per call: n - 1 > 10 / 90e-6 = 111,111.1 calls after the
    # first, so the 111,113th call is the first with a lower total.
    assert rows_compile.break_even(10.1, 10e-6, 0.1, 100e-6) == "111,113"
    assert rows_compile.break_even(10.0, 100e-6, 0.1, 100e-6) == "never"  # no faster per call
    assert rows_compile.break_even(0.05, 200e-6, 0.1, 100e-6) == "1"  # cheaper from the first call
    assert rows_compile.break_even(None, 1e-6, 0.1, 1e-4) == ""


def test_plot_writes_png_charts(tiny, tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "charts"
    assert bench.main(["--quick", "--rows", "vmap,pass_cost", "--plot", str(out)]) == 0
    charts = sorted(p.name for p in out.iterdir())
    assert charts == ["pass_cost.png", "vmap.png"]
    import matplotlib.image

    for name in charts:
        data = (out / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        height, width, _ = matplotlib.image.imread(out / name).shape  # decodes: a valid PNG
        assert height > 100 and width > 100
    assert f"wrote {out / 'vmap.png'}" in capsys.readouterr().out


def test_plot_without_matplotlib_names_the_extra(tiny, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises
    assert bench.main(["--quick", "--rows", "vmap", "--plot", "charts"]) == 2
    printed = capsys.readouterr().out
    assert "fxviews[bench]" in printed
    assert cli.title("vmap", cli.QUICK) not in printed  # refused before measuring


def test_row_5_baselines_run_the_same_ops_as_push_jvp() -> None:
    """Row 5 compares two graphs that differ only in how they return push_jvp's four tensors."""
    args = seed_args()
    (view, base), (view_t, base_t) = push_jvp(*args)  # eager: the reference
    tree = workloads.rewritten(fxviews.trace(push_jvp, *args))
    flat = workloads.rewritten(fxviews.trace(workloads.flat_push_jvp, *args))
    torch.testing.assert_close(tree.forward(*args), ((view, base), (view_t, base_t)))
    torch.testing.assert_close(flat.forward(*args), [view, base, view_t, base_t])

    def ops(gm):
        return [n.target for n in gm.graph.nodes if n.op == "call_function"]

    assert ops(tree) == ops(flat) and ops(tree)


def test_cpu_ratio_range_spans_the_rounds() -> None:
    calls = [timing.FirstCall(1.0, 1.1, 0.0), timing.FirstCall(1.0, 0.9, 0.0)]
    base = [timing.FirstCall(2.0, 1.0, 0.0), timing.FirstCall(2.0, 1.0, 0.0)]
    assert timing.cpu_ratio_range(calls, base) == "0.9-1.1x"
    assert timing.cpu_ratio_range(calls[:1], base[:1]) == ""  # one round: no range


def test_a_cold_compile_runs_in_a_child_and_counts_the_engine() -> None:
    # One fresh interpreter compiling push_jvp with backend="fxviews" (see Note [Cold compiles]):
    # the engine's time is part of the compile's CPU time, which covers the wall time's work.
    call = cold.cold_first_call(cold.FirstCallCase("compile", "fxviews"), threads=1)
    assert 0 < call.engine_s < call.cpu_s and call.wall_s > 0


def test_a_cold_compile_that_fails_says_why() -> None:
    with pytest.raises(RuntimeError, match="no_such_backend"):
        cold.cold_first_call(cold.FirstCallCase("compile", "no_such_backend"), threads=1)


# --------------------------------------------------------------------------------------------
# --device: the rows whose work is a device's, in synchronised wall time


def test_device_rows_run_on_the_device_in_wall_time(tiny, tmp_path, capsys, monkeypatch) -> None:
    """``--device cpu`` runs the device path end to end: every device row, its tensors on the
    device, each timed stretch synchronised at both ends."""
    synchronised = []
    real_synchronizer = timing.synchronizer

    def counting(device):
        synchronise = real_synchronizer(device)
        return lambda: synchronised.append(device) or synchronise()

    monkeypatch.setattr(timing, "synchronizer", counting)
    out_path = tmp_path / "bench.json"
    assert bench.main(["--quick", "--device", "cpu", "--json", str(out_path)]) == 0
    printed = capsys.readouterr().out
    assert report.FAILED not in printed
    device_settings = settings.on_device(cli.QUICK, "cpu")
    positions = [printed.index(cli.title(row, device_settings)) for row in cli.DEVICE_ROWS]
    assert positions == sorted(positions)
    assert "first call (wall)" in printed and "first call (cpu)" not in printed
    written = json.loads(out_path.read_text())
    assert written["meta"]["device"] == "cpu"
    assert list(written["rows"]) == list(cli.DEVICE_ROWS)
    assert [line["B"] for line in written["rows"]["compiled"]][0] == settings.COMPILED_BATCH
    assert synchronised and set(synchronised) == {"cpu"}  # rows 1, 7 and 8's steady states


def test_device_rows_on_an_accelerator_take_larger_batches() -> None:
    cuda = settings.on_device(settings.QUICK, "cuda")
    assert cuda.device == "cuda" and cuda.batch_sizes == settings.DEVICE_BATCH_SIZES
    assert cuda.models_batch == settings.DEVICE_MODELS_BATCH
    assert cli.title("models", cuda).startswith(
        f"8. whole models under vmap, B={cuda.models_batch}"
    )
    assert settings.on_device(settings.QUICK, "cpu").batch_sizes == settings.QUICK.batch_sizes


def test_a_device_this_machine_lacks_ends_the_run_before_measuring(capsys) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert bench.main(["--quick", "--device", "cuda"]) == 2
    printed = capsys.readouterr().out
    assert printed.startswith("fxviews bench: --device cuda: this machine has no CUDA device")
    assert len(printed.splitlines()) == 1  # one line, nothing measured


def test_device_runs_refuse_the_cpu_work_rows(capsys) -> None:
    assert bench.main(["--quick", "--device", "cpu", "--rows", "vmap,pass_cost"]) == 2
    assert "pass_cost" in capsys.readouterr().out
    assert bench.main(["--device", "meta"]) == 2
    assert "meta" in capsys.readouterr().out


def test_synchronised_timing_waits_around_each_timed_stretch() -> None:
    events = []
    calls = {"a": lambda: events.append("a"), "b": lambda: events.append("b")}
    timing.interleaved_samples(calls, 2, 0.0, lambda: 0.0, lambda: events.append("sync"))
    # Warm-up of each call between two synchronisations, then each repeat's loop likewise.
    assert events == ["sync", "a", "sync", "sync", "b", "sync"] + 2 * [
        "sync", "a", "sync", "sync", "b", "sync"
    ]  # fmt: skip


def test_a_device_failure_in_a_measured_path_ends_the_run(tiny, monkeypatch) -> None:
    """Not an n/a cell: later rows would measure on a dead device."""

    def faulting(*args, **kwargs):
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(rows_compile, "first_call_seconds", faulting)
    with pytest.raises(DeviceFailure, match="illegal memory access"):
        bench.main(["--quick", "--device", "cpu", "--rows", "first_call"])
