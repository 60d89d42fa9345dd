"""Deployment runtimes: each runs the strided programs right after ``fxviews.rewrite``.

Every program of ``tests/strided_programs.py`` is exported, handed to a runtime plain and after
``fxviews.rewrite(ep, opset=...)`` (the opset the runtime needs: ``docs/runtimes.md``), and run
there on two inputs other than the example, against eager PyTorch. What the plain program does
in each runtime is a measured fact of the installed version, asserted too (``PLAIN``): a
runtime that starts lowering ``as_strided`` right makes its row fail, and the table is updated.

Each runtime is skipped when its package is absent (``fxviews[openvino]``, ``[iree]``, ``[tvm]``,
``[litert]``, ``[jax]``), or when it is installed but cannot be imported beside this torch
(torchax 0.0.13 as released, beside torch 2.13-2.15: ``.ci/patch_torchax.py`` is the
workaround). ``make test-litert`` runs the LiteRT and JAX rows in a virtualenv of their own.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree

import fxviews
from fxviews.bench.mlir_as_strided import compile_for_iree
from tests.strided_programs import (
    ConvLinear,
    InputWindows,
    LongformerScores,
    NhwcPatches,
    PushJvp,
    SlicedWindow,
    StftFeatures,
    TorchStft,
    TransposedWindows,
    built,
    sample,
)

# Raised inside torch while the runtimes' converters copy exported programs.
pytestmark = pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated")

Tensors = list[torch.Tensor]
Runner = Callable[[tuple[torch.Tensor, ...]], Tensors]


@dataclass(frozen=True)
class Program:
    name: str
    make: Callable[[], torch.nn.Module]
    shapes: tuple[tuple[int, ...], ...]


PROGRAMS = [
    Program("input_windows", InputWindows, ((8,),)),
    Program("transposed_windows", TransposedWindows, ((4, 5), (5, 8))),
    Program("sliced_window", SlicedWindow, ((3, 4),)),
    Program("longformer_chunk", LongformerScores, ((1, 8, 2, 3), (1, 8, 2, 3))),
    Program("push_jvp", PushJvp, ((2, 6), (2, 6), (2, 6))),
    Program("stft_frames", StftFeatures, ((24, 2),)),
    Program("torch_stft", TorchStft, ((24, 2),)),
    Program("nhwc_patches", NhwcPatches, ((1, 3, 8, 8),)),
    Program("control", ConvLinear, ((2, 3, 5, 5),)),
]


def _inputs(program: Program, seed: int) -> tuple[torch.Tensor, ...]:
    return sample(program.shapes, seed)


def _module(name: str) -> torch.nn.Module:
    return built(next(p for p in PROGRAMS if p.name == name).make)


def _export(program: Program) -> torch.export.ExportedProgram:
    """A fresh export: IREE's importer rewrites the program it is given in place."""
    return torch.export.export(_module(program.name), _inputs(program, 0))


def _imported(name: str) -> ModuleType:
    """``name`` imported, or the test skipped: absent, or failing to import beside this torch
    (torchax 0.0.13 as released reads ``aten.prod.dim_Dimname``, which torch 2.13 no longer has)."""
    try:
        return importlib.import_module(name)
    except ImportError as err:
        pytest.skip(f"{name} is not installed ({err})")
    except Exception as err:  # an installed package broken by this torch: its own error
        pytest.skip(f"{name} does not import beside torch {torch.__version__}: {err!r}")


def _tensors(values: Any) -> Tensors:
    return [torch.from_numpy(np.array(v)) for v in pytree.tree_leaves(values)]


def _openvino(ep: torch.export.ExportedProgram) -> Runner:
    ov = _imported("openvino")
    # convert_model sets the root logger to ERROR (openvino.tools.ovc's init_logger) and leaves
    # it there: every later warning in this test process, fxviews' own included, would vanish.
    root = logging.getLogger()
    level = root.level
    try:
        model = ov.convert_model(ep)
    finally:
        root.setLevel(level)
    # f32: on CPUs with bf16 units OpenVINO would otherwise compute in bf16.
    compiled = ov.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return lambda args: _tensors(list(compiled([a.numpy() for a in args]).values()))


def _iree(ep: torch.export.ExportedProgram) -> Runner:
    return compile_for_iree(ep)[1]  # the bench's comparison with torch-mlir runs it too


def _tvm(ep: torch.export.ExportedProgram) -> Runner:
    tvm = _imported("tvm")
    relax = _imported("tvm.relax")
    torch_frontend = _imported("tvm.relax.frontend.torch")
    machine = relax.VirtualMachine(
        relax.build(torch_frontend.from_exported_program(ep), target="llvm"), tvm.cpu()
    )

    def run(args: tuple[torch.Tensor, ...]) -> Tensors:
        results = machine["main"](*[tvm.runtime.tensor(a.numpy()) for a in args])
        return _tensors([r.numpy() for r in results])

    return run


def _litert(ep: torch.export.ExportedProgram) -> Runner:
    litert_torch = _imported("litert_torch")
    # LiteRT exports a module itself: the program's module re-exports to the same ops.
    model = litert_torch.convert(ep.module(), ep.example_inputs[0])
    return lambda args: _tensors(model(*args))


def _jax(ep: torch.export.ExportedProgram) -> Runner:
    torchax_export = _imported("torchax.export")
    jax = _imported("jax")
    states, function = torchax_export.exported_program_to_jax(ep)
    compiled = jax.jit(function)
    return lambda args: _tensors(compiled(states, tuple(jax.numpy.asarray(a) for a in args)))


@dataclass(frozen=True)
class Runtime:
    """A runtime: how a program is converted and run, the opset fxviews rewrites it for, and
    whether the model's own ``unfold`` is copied too (opt in, for a runtime without it)."""

    name: str
    package: str  # imported first: a runtime absent skips before any export
    convert: Callable[[torch.export.ExportedProgram], Runner]
    opset: str
    copy_unfolds: bool = False


RUNTIMES = [
    Runtime("openvino", "openvino", _openvino, "aten"),
    Runtime("iree", "iree.turbine.aot", _iree, "aten"),
    # TVM Relax and LiteRT lower no unfold: windows, and the model's own unfolds, become copies
    # (slices joined by cat).
    Runtime("tvm", "tvm.relax", _tvm, "core_aten", copy_unfolds=True),
    Runtime("litert", "litert_torch", _litert, "core_aten", copy_unfolds=True),
    # torchax decomposes to core ATen before it translates, and lowers unfold.
    Runtime("jax", "torchax.export", _jax, "core_aten"),
]


@dataclass(frozen=True)
class Outcome:
    """``"right"``, ``"wrong"`` (other numbers, no error) or ``"fails"``, raising an error whose
    text holds ``error``."""

    kind: str
    error: str = ""


RIGHT, WRONG = Outcome("right"), Outcome("wrong")

#: What each runtime does with each plain exported program, as measured (torch 2.13.0;
#: openvino 2026.4.1, iree-turbine 3.9 with iree-base-compiler 3.13, apache-tvm 0.27,
#: litert-torch 0.10 with ai-edge-litert 2.3, torchax 0.0.13 with jax 0.10.2). Programs not
#: named are right.
PLAIN: dict[str, dict[str, Outcome]] = {
    "openvino": {"sliced_window": WRONG, "stft_frames": WRONG},
    # IREE's importer gathers every as_strided at static indices off its base tensor
    # (torch-mlir's fx_as_strided): right. It has no lowering of forward AD's ops.
    "iree": {"push_jvp": Outcome("fails", "_jvp_increment_nesting")},
    "tvm": {
        "input_windows": Outcome("fails", "non-contiguous stride"),
        "transposed_windows": Outcome("fails", "non-contiguous stride"),
        "sliced_window": Outcome("fails", "non-zero storage_offset"),
        "longformer_chunk": Outcome("fails", "non-contiguous stride"),
        "push_jvp": Outcome("fails", "Reshape expects the new shape"),
        "stft_frames": Outcome("fails", "non-zero storage_offset"),
        "nhwc_patches": Outcome("fails", "unfold"),
    },
    "litert": {
        "transposed_windows": WRONG,
        "sliced_window": Outcome("fails", "gather_nd index out of bounds"),
        "longformer_chunk": WRONG,
        "push_jvp": Outcome("fails", "View operation returned a tensor that is the same"),
        "stft_frames": Outcome("fails", "gather_nd index out of bounds"),
        "nhwc_patches": Outcome("fails", "at most 5-D"),
    },
    "jax": {
        "transposed_windows": WRONG,
        "sliced_window": WRONG,
        "longformer_chunk": WRONG,
        "stft_frames": WRONG,
    },
}

#: Where a runtime refuses a program after fxviews too: ops it has no lowering for, which
#: fxviews does not touch (``torch.stft`` exports as one ``aten.stft``, no as_strided). The
#: plain program is refused the same way.
OP_COVERAGE: dict[str, dict[str, Outcome]] = {
    "openvino": {
        "torch_stft": Outcome("fails", "No conversion rule found for operations: aten._fft_r2c")
    },
    "tvm": {"torch_stft": Outcome("fails", "'_fft_r2c.default'")},
    "litert": {"torch_stft": Outcome("fails", "Unsupported ir element type: complex<f32>")},
}


def _outcome(runtime: Runtime, program: Program, rewritten: bool) -> tuple[Outcome, str]:
    """What the runtime does with the program (plain or rewritten) on two inputs, and why."""
    _imported(runtime.package)
    ep = _export(program)
    if rewritten:
        rewritten_ep = fxviews.rewrite(ep, opset=runtime.opset, copy_unfolds=runtime.copy_unfolds)
        ep = rewritten_ep.exported_program
    samples = [_inputs(program, seed) for seed in (1, 2)]  # other inputs than the example
    wanted = [_eager(program, args) for args in samples]
    try:
        run = runtime.convert(ep)
        results = [run(args) for args in samples]
    except pytest.skip.Exception:
        raise
    except Exception as err:  # a converter's or a runtime's refusal: what the table records
        return Outcome("fails", str(err)), f"{type(err).__name__}: {err}"
    for got, want in zip(results, wanted, strict=True):
        if len(got) != len(want) or not all(_close(g, w) for g, w in zip(got, want, strict=True)):
            return WRONG, f"got {got}, eager gives {want}"
    return RIGHT, ""


def _eager(program: Program, args: tuple[torch.Tensor, ...]) -> Tensors:
    with torch.no_grad():
        return [t.detach() for t in pytree.tree_leaves(_module(program.name)(*args))]


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.shape == want.shape and torch.allclose(got, want, rtol=1e-4, atol=1e-4)


def _expected(runtime: Runtime, program: Program, rewritten: bool) -> Outcome:
    refused = OP_COVERAGE.get(runtime.name, {}).get(program.name)
    if refused is not None:
        return refused
    return RIGHT if rewritten else PLAIN[runtime.name].get(program.name, RIGHT)


def _assert_outcome(actual: tuple[Outcome, str], expected: Outcome) -> None:
    outcome, detail = actual
    assert outcome.kind == expected.kind, detail
    assert expected.error in outcome.error, detail


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
@pytest.mark.parametrize("runtime", RUNTIMES, ids=lambda r: r.name)
def test_rewritten_program_runs_like_eager(runtime, program):
    """Right, or refused for an op the runtime lacks (``OP_COVERAGE``), as the plain one is."""
    _assert_outcome(_outcome(runtime, program, True), _expected(runtime, program, True))


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
@pytest.mark.parametrize("runtime", RUNTIMES, ids=lambda r: r.name)
def test_plain_program_as_measured(runtime, program):
    """The plain program is right, silently wrong, or refused, as ``PLAIN`` says."""
    _assert_outcome(_outcome(runtime, program, False), _expected(runtime, program, False))


def test_control_reaches_the_runtimes_as_exported():
    """No as_strided: in core ATen the program is the exported one out of the training IR; in
    ATen the reshape step's ``view`` -> ``reshape`` (for vmap) is the only change."""
    ep = _export(next(p for p in PROGRAMS if p.name == "control"))
    res = fxviews.rewrite(ep, opset="core_aten", copy_unfolds=True)
    assert not res.modified
    assert res.exported_program.graph_module.code == ep.run_decompositions({}).graph_module.code
    res = fxviews.rewrite(ep)
    assert res.records == [] and [r.method for r in res.view_records] == ["reshape"]


def test_torch_mlir_comparison_measures_both_routes():
    """``python -m fxviews.bench.mlir_as_strided`` on its smallest program: both right in IREE,
    torch-mlir's pass with index constants, fxviews with none."""
    _imported("iree.turbine.aot")
    from fxviews.bench import mlir_as_strided

    program = next(p for p in mlir_as_strided.PROGRAMS if p.name == "rows of a column slice")
    measured = mlir_as_strided.measure(program, repeats=1)
    assert measured["torch-mlir"].right and measured["fxviews"].right, measured
    assert "+1 index" in measured["torch-mlir"].ops and measured["torch-mlir"].constant_bytes
    assert "index" not in measured["fxviews"].ops and measured["fxviews"].constant_bytes == 0
