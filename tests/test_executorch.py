"""``fxviews.executorch``: exported programs with strided views lower, delegate and run right.

Each program is exported once, rewritten for the edge (``opset="core_aten"``), lowered with the
XNNPACK partitioner and without it (ExecuTorch's plain ``to_edge`` of the rewritten program,
whose verifier checks core ATen), and its .pte run in ExecuTorch's runtime on two inputs other
than the example, against eager PyTorch. Lowering is slow, so each program is exported, lowered
and serialized once per route for the whole file. The
same program lowered by plain ExecuTorch is run too: where the table below says it is wrong or
fails, the test asserts it is, so the bug stays a measured one on the installed version.
Needs the ``executorch`` extra; skipped without it.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.utils._pytree as pytree

pytest.importorskip("executorch")
exir = pytest.importorskip("executorch.exir")
runtime = pytest.importorskip("executorch.runtime")
xnnpack = pytest.importorskip("executorch.backends.xnnpack.partition.xnnpack_partitioner")

import fxviews  # noqa: E402
from tests.strided_programs import (  # noqa: E402
    ColumnJvp,
    ConvLinear,
    InputWindows,
    LongformerScores,
    NhwcPatches,
    OffsetWindows,
    PushJvp,
    SlicedWindow,
    StftFeatures,
    TransposedWindows,
    built,
    sample,
)

# Raised inside ExecuTorch 1.5.1 (deep copies of pytree specs, its flatbuffer serializer).
pytestmark = [
    pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated"),
    pytest.mark.filterwarnings("ignore:read_binary is deprecated"),
]


@dataclass(frozen=True)
class Program:
    """A module, its input shapes, and what plain ExecuTorch 1.5.1 does with it (measured):
    ``"right"``, ``"wrong"`` (other numbers, no error) or ``"fails"`` (at run time)."""

    name: str
    make: Callable[[], torch.nn.Module]
    shapes: tuple[tuple[int, ...], ...]
    plain: str


PROGRAMS = [
    Program("input_windows", InputWindows, ((8,),), "right"),
    Program("transposed_windows", TransposedWindows, ((4, 5), (5, 8)), "wrong"),
    Program("sliced_window", SlicedWindow, ((3, 4),), "fails"),
    Program("offset_windows", OffsetWindows, ((12,),), "wrong"),
    Program("longformer_chunk", LongformerScores, ((1, 8, 2, 3), (1, 8, 2, 3)), "wrong"),
    Program("stft_features", StftFeatures, ((24, 2),), "fails"),
    Program("push_jvp", PushJvp, ((2, 6), (2, 6), (2, 6)), "right"),
    Program("column_jvp", ColumnJvp, ((4, 5), (4, 5), (4, 5)), "right"),
    Program("control", ConvLinear, ((2, 3, 5, 5),), "right"),
]
WITH_AS_STRIDED = [p for p in PROGRAMS if p.name != "control"]


def _inputs(program: Program, seed: int) -> tuple[torch.Tensor, ...]:
    return sample(program.shapes, seed)


def _module(name: str) -> torch.nn.Module:
    return built(next(p for p in PROGRAMS if p.name == name).make)


@functools.cache
def _exported(name: str) -> torch.export.ExportedProgram:
    program = next(p for p in PROGRAMS if p.name == name)
    return torch.export.export(_module(name), _inputs(program, 0))


#: How a program reaches ExecuTorch: fxviews then XNNPACK, fxviews then ExecuTorch's plain
#: ``to_edge`` (portable kernels only; the core-ATen check), plain ExecuTorch with XNNPACK.
ROUTES = ("fxviews+xnnpack", "fxviews+portable", "plain+xnnpack")


@functools.cache
def _lowered(name: str, route: str):
    """The EdgeProgramManager of one program along one route."""
    partitioner = [xnnpack.XnnpackPartitioner()]
    if route == "fxviews+xnnpack":
        return fxviews.executorch.to_edge_transform_and_lower(
            _exported(name), partitioner=partitioner
        )
    if route == "fxviews+portable":
        return fxviews.executorch.to_edge(_exported(name))
    return exir.to_edge_transform_and_lower(_exported(name), partitioner=partitioner)


@functools.cache
def _pte(name: str, route: str) -> bytes:
    """The .pte of one program along one route (``to_executorch`` runs once per manager)."""
    return _lowered(name, route).to_executorch().buffer


def _run(name: str, route: str, args: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """Run the .pte's forward in ExecuTorch's runtime, from its in-memory buffer."""
    method = runtime.Runtime.get().load_program(_pte(name, route)).load_method("forward")
    return list(method.execute(list(args)))


def _eager(name: str, args: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    return pytree.tree_leaves(_module(name)(*args))


def _lowered_ops(edge) -> tuple[Counter[str], Counter[str]]:
    """(delegated, portable) op counts of a lowered program, by edge op name."""
    gm = edge.exported_program().graph_module
    delegated: Counter[str] = Counter()
    portable: Counter[str] = Counter()
    for node in gm.graph.nodes:
        if node.op == "get_attr" and node.name.startswith("lowered_module_"):
            inner = getattr(gm, node.name).original_module.graph
            delegated.update(str(n.target) for n in inner.nodes if n.op == "call_function")
        elif node.op == "call_function" and "executorch_call_delegate" not in str(node.target):
            if str(node.target) != "<built-in function getitem>":
                portable[str(node.target)] += 1
    return delegated, portable


@pytest.mark.parametrize("program", WITH_AS_STRIDED, ids=lambda p: p.name)
def test_rewritten_program_passes_plain_to_edge(program):
    """Every as_strided is rewritten, and ExecuTorch's own to_edge (its core-ATen verifier)
    takes the program: no as_strided and no unfold reach the edge."""
    records = fxviews.rewrite(_exported(program.name), opset="core_aten").records
    assert records and all(r.method != "kept" for r in records), records
    edge = _lowered(program.name, "fxviews+portable")  # exir.to_edge of the rewritten program
    targets = {str(n.target) for n in edge.exported_program().graph.nodes}
    assert not any("as_strided" in t or "unfold" in t for t in targets), targets


@pytest.mark.parametrize("route", ["fxviews+xnnpack", "fxviews+portable"])
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_pte_runs_like_eager(program, route):
    for seed in (1, 2):  # two inputs other than the example
        args = _inputs(program, seed)
        got, want = _run(program.name, route, args), _eager(program.name, args)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("program", WITH_AS_STRIDED, ids=lambda p: p.name)
def test_plain_executorch_as_measured(program):
    """Plain ExecuTorch is right, silently wrong, or fails at run time, as the table says."""
    args = _inputs(program, 1)
    if program.plain == "fails":
        with pytest.raises(RuntimeError):
            _run(program.name, "plain+xnnpack", args)
        return
    got, want = _run(program.name, "plain+xnnpack", args), _eager(program.name, args)
    close = all(
        g.shape == w.shape and torch.allclose(g, w, rtol=1e-4, atol=1e-4)
        for g, w in zip(got, want, strict=True)
    )
    assert close == (program.plain == "right")


def test_control_lowers_exactly_as_plain_executorch():
    """No as_strided: the same ops delegated to XNNPACK and the same left to portable kernels
    (linear reaches XNNPACK as linear, not decomposed first)."""
    with_fxviews = _lowered_ops(_lowered("control", "fxviews+xnnpack"))
    plain = _lowered_ops(_lowered("control", "plain+xnnpack"))
    assert with_fxviews == plain
    assert any("linear" in op for op in plain[0]), plain


@pytest.mark.parametrize("name", ["input_windows", "longformer_chunk", "sliced_window"])
def test_window_chains_are_delegated(name):
    """The ops fxviews writes for windows (slice, view, permute, cat) all reach XNNPACK."""
    delegated, portable = _lowered_ops(_lowered(name, "fxviews+xnnpack"))
    chain_ops = ("slice_copy", "view_copy", "permute_copy", "cat", "select_copy", "index_select")
    assert not [op for op in portable if any(c in op for c in chain_ops)], portable
    assert any("slice_copy" in op for op in delegated), delegated


def test_dict_of_methods_is_rewritten_per_method_and_left_unmodified():
    programs = {"forward": _exported("sliced_window"), "windows": _exported("input_windows")}
    code_before = {name: ep.graph_module.code for name, ep in programs.items()}
    rewritten = fxviews.executorch.rewrite_for_edge(programs)
    assert set(rewritten) == set(programs)
    for ep in rewritten.values():
        assert not any("as_strided" in str(n.target) for n in ep.graph.nodes)
    assert {name: ep.graph_module.code for name, ep in programs.items()} == code_before


def test_a_method_that_is_no_exported_program_is_named():
    with pytest.raises(TypeError, match="method 'encode' is a Linear"):
        fxviews.executorch.rewrite_for_edge({"encode": torch.nn.Linear(2, 2)})


def test_kept_as_strided_that_would_read_wrong_raises():
    """A kept node on a transposed input would read other elements on device: refused, named."""

    class Unsafe(torch.nn.Module):
        def forward(self, x):  # reads past the transposed view's elements: no view form
            return x.t().as_strided((2, 2), (1, 1), 7)

    ep = torch.export.export(Unsafe(), (torch.randn(3, 3),))
    with pytest.raises(fxviews.FxViewsError, match="not provably contiguous"):
        fxviews.executorch.rewrite_for_edge(ep)


def test_missing_executorch_names_the_extra(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "executorch.exir", None)
    with pytest.raises(ImportError, match=r"fxviews\[executorch\]"):
        fxviews.executorch.to_edge(_exported("sliced_window"))


def test_own_unfold_is_copied_for_to_edge_when_asked():
    """A patch embedding's own unfold: to_edge refuses it (not core ATen) unless copied."""
    module, shapes = built(NhwcPatches), ((1, 3, 8, 8),)
    ep = torch.export.export(module, sample(shapes, 0))
    with pytest.raises(Exception, match="unfold.default is not in Core ATen"):
        fxviews.executorch.to_edge(ep)
    pte = fxviews.executorch.to_edge(ep, copy_unfolds=True).to_executorch().buffer
    method = runtime.Runtime.get().load_program(pte).load_method("forward")
    for seed in (1, 2):
        args = sample(shapes, seed)
        [got] = method.execute(list(args))
        torch.testing.assert_close(got, module(*args), rtol=1e-4, atol=1e-4)
