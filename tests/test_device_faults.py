"""A device error is fatal, never an answer: fxviews and the device-ready tests stop on it.

No test here needs an accelerator. A ``torch.AcceleratorError`` (what PyTorch raises for an
illegal memory access) is raised where a kernel would fail, and a device that no longer works is
a probe answering so (``device_faults.still_works`` patched): each stands in for what a broken
CUDA context does, at the places that used to read any failure as an answer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

import fxviews
import fxviews.tracing.capture as capture_module
from fxviews.passes import device_faults
from fxviews.passes.analysis import layout_truth
from fxviews.passes.compat.torch_internals import op_db
from fxviews.passes.device_faults import DeviceFailure, raise_if_device_failed
from tests import device_checks

REPO = Path(__file__).resolve().parent.parent

ILLEGAL_ACCESS = "CUDA error: an illegal memory access was encountered"


def _faulting(*args, **kwargs):
    raise torch.AcceleratorError(ILLEGAL_ACCESS)


def test_an_accelerator_error_is_a_device_failure_naming_what_ran() -> None:
    with pytest.raises(DeviceFailure, match="the eager kernel of roll failed") as caught:
        raise_if_device_failed(
            torch.AcceleratorError(ILLEGAL_ACCESS), [], "the eager kernel of roll"
        )
    assert ILLEGAL_ACCESS in str(caught.value) and "CUDA_LAUNCH_BLOCKING=1" in str(caught.value)
    assert isinstance(caught.value.__cause__, torch.AcceleratorError)


def test_an_ops_own_refusal_on_a_working_device_is_left_to_the_caller() -> None:
    raise_if_device_failed(RuntimeError("shape '[3]' is invalid"), [torch.device("cpu")], "view")


def test_any_error_after_which_the_device_fails_its_probe_is_fatal(monkeypatch) -> None:
    # After an illegal access, cuBLAS and others raise plain RuntimeErrors: the probe tells.
    monkeypatch.setattr(device_faults, "still_works", lambda device: device.type != "cuda")
    with pytest.raises(DeviceFailure, match="on cuda:0"):
        raise_if_device_failed(
            RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED"), [torch.device("cuda:0")], "mm"
        )


def test_the_probe_trusts_cpu_and_devices_this_process_cannot_reach() -> None:
    assert device_faults.still_works(torch.device("cpu"))
    assert device_faults.still_works(torch.device("meta"))
    if not torch.cuda.is_available():
        assert device_faults.still_works(torch.device("cuda"))  # fake CUDA tensors' device


def test_a_device_failure_is_not_a_runtime_error() -> None:
    # The handlers that read an op's refusal as an answer catch RuntimeError: not this.
    assert not issubclass(DeviceFailure, RuntimeError)


# --- in fxviews itself -------------------------------------------------------------------------


def _roll_then_window(x: torch.Tensor) -> torch.Tensor:
    # roll of a channels_last tensor: its fake layout is not eager's, so layout truth runs the
    # eager kernel (pytorch/pytorch#174963).
    return torch.roll(x, shifts=-1, dims=0).as_strided((5, 10), (4, 1), 0)


def _channels_last() -> torch.Tensor:
    return torch.arange(100.0).reshape(2, 5, 2, 5).to(memory_format=torch.channels_last)


def test_layout_truth_raises_where_its_eager_kernel_breaks_the_device(monkeypatch) -> None:
    gm = fxviews.trace(_roll_then_window, _channels_last())
    layout_truth._EAGER_RUNS.clear()
    monkeypatch.setattr(layout_truth, "_layout_of", _faulting)
    with pytest.raises(DeviceFailure, match=r"the eager kernel of .*roll"):
        fxviews.rewrite(gm)


def test_layout_truth_still_keeps_a_node_whose_kernel_fails_on_a_working_device(
    monkeypatch,
) -> None:
    def refusing(value):
        raise RuntimeError("this kernel refuses zeros")

    gm = fxviews.trace(_roll_then_window, _channels_last())
    layout_truth._EAGER_RUNS.clear()
    monkeypatch.setattr(layout_truth, "_layout_of", refusing)
    result = fxviews.rewrite(gm)
    layout_truth._EAGER_RUNS.clear()
    [kept] = [r for r in result.records if r.method == "kept"]
    assert "fails on zeros" in kept.reason


def test_layout_truth_raises_where_the_device_cannot_allocate_after_a_fault(monkeypatch) -> None:
    gm = fxviews.trace(_roll_then_window, _channels_last())
    layout_truth._EAGER_RUNS.clear()
    monkeypatch.setattr(layout_truth._Spec, "make", _faulting)
    with pytest.raises(DeviceFailure, match="making the arguments"):
        fxviews.rewrite(gm)
    layout_truth._EAGER_RUNS.clear()


def test_a_recording_that_breaks_the_device_is_not_retried_in_fake_mode(monkeypatch) -> None:
    traced_in_fake_mode = []
    monkeypatch.setattr(capture_module, "_record_on_a_sample", _faulting)
    monkeypatch.setattr(
        capture_module, "exact_fake_mode", lambda **kw: traced_in_fake_mode.append(kw)
    )
    with pytest.raises(DeviceFailure, match="recording"):
        fxviews.transform(torch.sin)(torch.randn(3))
    assert not traced_in_fake_mode


# --- in the tests ------------------------------------------------------------------------------


def test_the_device_breaking_ops_exist_and_are_left_out_on_their_device_only(monkeypatch) -> None:
    names = {info.name for info in op_db}
    for device_type, ops in device_checks.DEVICE_BREAKING_OPS.items():
        assert set(ops) <= names, f"stale entries for {device_type}: {set(ops) - names}"
    monkeypatch.setattr(device_checks, "TEST_DEVICE", torch.device("cpu"))
    assert device_checks.device_breaking_reason("jiterator_unary") is None
    monkeypatch.setattr(device_checks, "TEST_DEVICE", torch.device("cuda"))
    assert "illegal memory access" in device_checks.device_breaking_reason("jiterator_unary")
    assert device_checks.device_breaking_reason("roll") is None


def test_a_sweep_sample_that_breaks_the_device_fails_instead_of_being_no_case() -> None:
    from tests import test_layout_truth

    sample = types.SimpleNamespace(input=torch.randn(2, 3, 4), args=(), kwargs={})
    info = types.SimpleNamespace(op=_faulting, full_name="faulting")
    with pytest.raises(DeviceFailure, match="OpInfo faulting"):
        test_layout_truth._first_case(info, "faulting", lambda t: t, [sample])


def test_a_failure_check_that_breaks_the_device_is_not_a_failed_layout() -> None:
    from tests.differential import failures

    with pytest.raises(DeviceFailure, match="bd=1"):
        failures({"bd=0": lambda: None, "bd=1": _faulting})


def test_a_device_failure_stops_the_whole_test_run(tmp_path) -> None:
    """The conftest hook: the first test fails with the device's error, the rest never run."""
    (tmp_path / "test_dead_device.py").write_text(
        textwrap.dedent(
            f"""
            import torch

            def test_faults():
                raise torch.AcceleratorError({ILLEGAL_ACCESS!r})

            def test_after_the_fault():
                pass
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest"]
        + ["--rootdir", str(tmp_path), str(tmp_path / "test_dead_device.py")],
        capture_output=True,
        text=True,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "1 failed" in out and "passed" not in out, out
    assert "AcceleratorError" in out and "test_faults" in out, out


def test_the_device_script_names_what_is_missing_in_one_line(tmp_path) -> None:
    """tests/on_device.sh on a Python that lacks a package: one line naming it, nothing run."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "expecttest.py").write_text("raise ImportError('not on this machine')\n")
    logs = tmp_path / "logs"
    env = {
        **os.environ,
        "DEVICE": "cpu",
        "PYTHON": sys.executable,
        "WHEELS": str(tmp_path / "no_wheels"),
        "PYTHONPATH": str(hidden),
    }
    done = subprocess.run(
        [str(REPO / "tests" / "on_device.sh"), str(logs)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert done.returncode != 0
    [line, summary] = done.stdout.splitlines()
    assert line.startswith("preflight: python ") and "lacks expecttest" in line, line
    assert "nothing ran" in summary
    assert sorted(p.name for p in logs.iterdir()) == ["preflight.log", "summary.txt"]
