"""What a new user meets in the first hour: import cost as behaviour, flags, CLI, printouts.

Timings live in the bench (``python -m fxviews bench --rows startup``); here only what must
hold whatever the machine: ``import fxviews`` imports neither Dynamo nor the engine.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch

import fxviews
import fxviews.tracing.capture as capture_module
from tests.fresh_python import run_fresh_python


def test_import_fxviews_imports_neither_dynamo_nor_the_engine() -> None:
    loaded = run_fresh_python(
        "import sys, fxviews\n"
        "print(sorted(m for m in ('torch._dynamo', 'sympy', 'fxviews.passes.chains.synthesis')"
        " if m in sys.modules))"
    )
    assert loaded.strip() == "[]"


def test_public_names_import_on_first_use() -> None:
    loaded = run_fresh_python(
        "import sys, torch, fxviews\n"
        "fxviews.transform(lambda x: x * 2)(torch.ones(2))\n"
        "print('fxviews.calls.cache' in sys.modules)\n"
        "print(fxviews.as_strided(torch.arange(4.0), (2,), (2,)).tolist())\n"
        "print(fxviews.AsStridedRequestError.__mro__[1].__name__, fxviews.RecordKind.VIEW.value)\n"
        "print(set(fxviews.__all__) <= set(dir(fxviews)), 'Geometry' in dir(fxviews.passes))"
    )
    assert loaded.splitlines() == ["True", "[0.0, 2.0]", "FxViewsError view", "True True"]


# --- flags: a switch given something other than a bool is a mistake, not "true" ---------------


@pytest.mark.parametrize("value", ["yes", 1, 0, None, "False"])
def test_transform_and_explain_refuse_a_strict_that_is_not_a_bool(value: object) -> None:
    with pytest.raises(TypeError, match=r"fxviews\.transform: strict must be True or False"):
        fxviews.transform(torch.sin, strict=value)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"fxviews\.explain: strict must be"):
        fxviews.explain(torch.sin, torch.ones(2), strict=value)  # type: ignore[arg-type]


def test_rewrite_trace_and_backend_refuse_flags_that_are_not_bools() -> None:
    gm = fxviews.trace(torch.sin, torch.ones(2))
    with pytest.raises(TypeError, match=r"fxviews\.rewrite: strict must be True or False, got 1"):
        fxviews.rewrite(gm, strict=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"reshape_views must be True, False or None, got 'no'"):
        fxviews.rewrite(gm, reshape_views="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"fxviews\.trace: functionalize must be"):
        fxviews.trace(torch.sin, torch.ones(2), functionalize="yes")
    with pytest.raises(TypeError, match=r"fxviews\.backend: strict must be"):
        fxviews.backend(strict="yes")  # type: ignore[arg-type]
    # The bools themselves, and None where a default depends on other arguments, still work.
    assert fxviews.rewrite(gm, strict=True, reshape_views=None).graph_module is not None


@pytest.mark.parametrize(
    "size, stride",
    [((-1,), (1,)), ((2, -3), (1, 1)), ((2,), (-1,))],
)
def test_an_invalid_as_strided_is_reported_in_eager_pytorchs_words(size, stride) -> None:
    t = torch.randn(4)
    with pytest.raises(RuntimeError) as eager:
        t.as_strided(size, stride)
    with pytest.raises(fxviews.TracingError) as traced:
        fxviews.explain(lambda x: x.as_strided(size, stride), t)
    message = str(traced.value)
    assert "is invalid: eager PyTorch raises" in message
    assert str(eager.value).splitlines()[0] in message  # eager's own words
    assert "integer multiplication overflow" not in message


# --- printouts: within the width, names whole, reasons readable -------------------------------


def _demo(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    from fxviews.cli import main

    assert main(["demo", *argv]) == 0
    return capsys.readouterr().out


def test_demo_keeps_every_line_within_its_width_and_names_whole(capsys) -> None:
    printed = _demo(capsys, "--width", "60")
    assert max(len(line) for line in printed.splitlines()) <= 60
    # The table's code cells break between names, never inside one.
    table = printed[printed.index("node ") : printed.index("fxviews: as_strided")]
    assert "as_strided(" in table and "select(" in table
    for line in table.splitlines():
        for cell in line.split("  "):
            assert not cell.strip().startswith(("ed(", "strided")), line
    # The reason sits under its row, as prose across the table's width.
    assert "reason: replays the graph's own view ops" in table
    # Wrapped diff lines keep their marker: every line of the diff is -, + or context.
    diff = printed[printed.index("--- before") : printed.index("\n4. ")]
    body = [line for line in diff.splitlines()[3:] if line]
    assert all(line[0] in "-+ " for line in body)
    assert sum(line.startswith("-") for line in body) > 10  # removed lines, wrapped, all marked


def test_demo_with_one_sample_says_why_the_bug_cannot_show(capsys) -> None:
    printed = _demo(capsys, "--batch-size", "1")
    assert "largest error 0\n" in printed
    assert "batch dim has size 1" in printed and "--batch-size 2" in printed
    assert "batch dim has size 1" not in _demo(capsys, "--batch-size", "3")


def test_a_kept_scatter_names_the_op_its_region_needs_in_good_grammar() -> None:
    def windows_written_back(x, src):
        return torch.as_strided_scatter(x * 1, src, (3, 2), (1, 1))

    res = fxviews.explain(windows_written_back, torch.randn(4), torch.randn(3, 2))
    assert [r.reason for r in res.records] == ["its region needs unfold, which has no scatter form"]


# --- the first call's memory: the recording copies one sample only while it is small ----------


def test_a_sample_past_the_recording_limit_is_traced_in_fake_mode(monkeypatch, caplog) -> None:

    def windows(x):
        return x.as_strided((x.numel() - 2, 3), (1, 1)) * 2

    samples = [torch.randn(16) for _ in range(3)]
    xs = torch.stack(samples, dim=1)  # batch dim physically last
    expected = torch.stack([windows(s) for s in samples])
    for limit, fake in [(16 * 4, False), (16 * 4 - 1, True)]:  # one sample: 64 bytes
        monkeypatch.setattr(capture_module, "RECORDING_LIMIT_BYTES", limit)
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="fxviews"):
            got = torch.func.vmap(fxviews.transform(windows), in_dims=1)(xs)
        torch.testing.assert_close(got, expected)
        said = [r.getMessage() for r in caplog.records if "a sample holds" in r.getMessage()]
        assert [
            m.endswith("windows is traced in fake mode: a sample holds 64 bytes") for m in said
        ] == [True] * fake


# --- the bench: fails fast on bad outputs, plain help, PyTorch's warnings collected -------------


def test_bench_refuses_an_output_path_it_cannot_write_before_measuring(tmp_path, capsys) -> None:
    from fxviews import bench

    missing = tmp_path / "no" / "such" / "dir"
    a_file = tmp_path / "file.txt"
    a_file.write_text("")
    for argv, said in [
        (["--json", str(missing / "x.json")], f"its directory {missing} does not exist"),
        (["--json", str(tmp_path)], "is a directory"),
        (["--plot", str(a_file)], "exists and is not a directory"),
    ]:
        assert bench.main(["--rows", "vmap", *argv]) == 2
        printed = capsys.readouterr().out
        assert said in printed
        assert bench.BENCHES["vmap"][0] not in printed  # nothing was measured
    # A chart directory that does not exist yet is made by the bench: not refused.
    assert bench.cli.unwritable(str(tmp_path / "new" / "charts"), "directory") is None
    assert bench.cli.unwritable(str(tmp_path / "x.json"), "file") is None


def test_bench_help_is_plain_text_and_breaks_no_row_name(capsys) -> None:
    from fxviews.cli import main

    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = capsys.readouterr().out
    for markup in ("``", ":mod:", ":func:", "rows_runtime", "fxviews.bench."):
        assert markup not in text
    words = set(text.replace(",", " ").split())
    from fxviews.bench import ROWS

    assert set(ROWS) <= words  # every row name whole in the help, none broken over two lines


def test_collected_output_catches_cpp_warnings_and_says_once_what_it_silenced() -> None:
    from fxviews.bench.output import collected_output, summarize

    fallback = (
        "[W1204 BatchedFallback.cpp:84] Warning: There is a performance drop because we have "
        "not yet implemented the batching rule for {}. Please file us an issue on GitHub\n"
    )
    with collected_output() as collected:
        for op in ("aten::native_batch_norm", "aten::median", "aten::median"):
            os.write(2, fallback.format(op).encode())  # as PyTorch's C++ writes it
        os.write(2, b"something else\n")
        os.write(2, b"something else\n")
    lines = summarize(collected)
    assert lines[0] == (
        "note: PyTorch warned 3 times that vmap runs ops without a batching rule one sample at "
        "a time (slower, not wrong): aten::median, aten::native_batch_norm; silenced above"
    )
    assert lines[1:] == [
        "note: 2 other line(s) PyTorch or a library printed meanwhile:",
        "  something else (x2)",
    ]


def test_progress_line_names_the_row_the_case_and_the_seconds() -> None:
    import io

    from fxviews.bench.output import Progress

    progress = Progress()
    progress.terminal = io.StringIO()
    with progress.row("8. whole models under vmap, B=8: per-sample grads"):
        progress.step("resnet18, grad")
    drawn = progress.terminal.getvalue()
    assert "[8. whole models under vmap, B=8: resnet18, grad, 0 s]" in drawn
    assert drawn.endswith("\r\033[K")  # erased when the row ends: the table prints clean


def test_a_path_that_cannot_capture_a_model_says_why(monkeypatch) -> None:
    from fxviews.bench import rows_models

    def refuses(fn):
        raise RuntimeError("Dynamo cannot trace this\nsecond line")

    note = rows_models._first_calls(lambda: torch.sin, refuses, (torch.ones(2),), 1)
    assert (
        note == "n/a, it cannot capture this program here (RuntimeError: Dynamo cannot trace this)"
    )


def test_the_floor_column_is_explained_under_its_table() -> None:
    from fxviews.bench.report import legend

    assert legend([{"vmap_floor_s": 1e-5, "note": ""}])[0].startswith("floor: vmap of a function")
    assert legend([{"vmap_floor_s": None, "note": ""}]) == []


def test_startup_and_memory_rows_measure_in_fresh_interpreters() -> None:
    from fxviews.bench import rows_first_hour, settings

    tiny = settings.Settings(1, 0.0, (8,), (1_000,), 1, False, memory_mb=8)
    startup = rows_first_hour.bench_startup(tiny)
    assert [line["command"] for line in startup] == [
        "import fxviews (after torch)",
        "python -m fxviews --help",
    ]
    assert all(line["median_s"] > 0 for line in startup)
    memory = rows_first_hour.bench_memory(tiny)
    assert [line["path"] for line in memory] == list(rows_first_hour.MEMORY_PATHS)
    assert all(line["note"] == "" and line["peak_mb"] >= 0 for line in memory)


def test_a_long_note_is_printed_under_its_table_so_rows_stay_within_the_width() -> None:
    from fxviews.bench.report import render

    why = "aot: n/a, it cannot capture this program here (TorchRuntimeError: " + "x " * 60 + ")"
    table = [{"model": m, "time_s": None, "note": why} for m in ("vit", "resnet")]
    table.append({"model": "mlp", "time_s": 1e-3, "note": "short"})
    lines = render(table).splitlines()
    assert max(len(line) for line in lines) <= 100
    assert [line.split()[-1] for line in lines[2:5]] == ["[1]", "[1]", "short"]
    assert " ".join(lines[5:]).replace("  ", " ").startswith("[1] aot: n/a, it cannot capture")


# --- the real-model tests: skipped with the reason, or failed where CI requires them ---------


@pytest.mark.parametrize("required", ["", "1"])
def test_a_missing_zoo_library_skips_the_real_models_or_fails_them_where_required(
    required: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fxviews.bench import zoo
    from tests.real_models import REQUIRE_ZOO, require_zoo_or_skip

    monkeypatch.setenv(REQUIRE_ZOO, required)
    monkeypatch.setattr(zoo, "unavailable", lambda library: f"{library} does not import: boom")
    expected = pytest.fail.Exception if required else pytest.skip.Exception
    with pytest.raises(expected, match="torchvision does not import: boom") as caught:
        require_zoo_or_skip("torchvision")
    assert (REQUIRE_ZOO in str(caught.value)) == bool(required)
    monkeypatch.setattr(zoo, "unavailable", lambda library: None)
    require_zoo_or_skip("torchvision", "timm")  # both import: the test runs
