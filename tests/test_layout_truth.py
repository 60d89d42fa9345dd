"""Layout truth: an as_strided over an op whose fake layout is not eager's is right everywhere.

The engine proves each rewrite against the traced layout of the as_strided's input; where that
layout came from a fake kernel that disagrees with the eager one, fxviews must check it and keep
the node (Note [Layouts are facts to check] in ``passes/analysis/layout_truth.py``).

The cases are found at run time, on the torch under test (the set differs by release): a sweep
over PyTorch's OpInfo samples (float32, small ones, on :data:`tests.reference.TEST_DEVICE`:
CPU unless ``FXVIEWS_TEST_DEVICE`` names another, whose kernels may lay out results otherwise)
puts every floating tensor of a sample in one of four layouts (channels_last-like, transposed,
sliced, offset), runs the op eagerly and under ``FakeTensorMode``, and keeps the samples whose
output layouts differ (with the issue's ``roll`` of a channels_last tensor, when this release
gets it wrong). Each case is then::

    fn(*tensors) = op(*in_layout(tensors)).as_strided((numel,), (1,), offset)

which reads the output's memory in storage order: other numbers on the fake layout than on the
eager one. Every entry point whose graph comes from fake mode must return what eager ``fn``
returns: ``trace`` + ``rewrite`` (which must keep the node, name the op and raise with
``strict=True``), ``transform``'s fake-mode path, the compile backend (static and dynamic) and
``rewrite`` of an exported program.
"""

from __future__ import annotations

import functools
import itertools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx

import fxviews
import fxviews.tracing.capture as capture_module
from fxviews.passes.compat.torch_internals import FakeTensorMode, op_db
from fxviews.passes.geometry.concrete import Geometry, equivalent, is_one_to_one
from fxviews.passes.random_state import reachable_cuda_devices
from fxviews.passes.schema import LAYOUT_DOUBT, REAL_LAYOUTS
from fxviews.rewriting.printouts import format_result
from tests.device_checks import device_breaking_reason, raise_if_test_device_failed
from tests.reference import TEST_DEVICE, as_strided_nodes, randn, rng_states

#: Samples tried per op and layout: the first one the layout applies to is taken.
SAMPLES_PER_OP = 4
MAX_NUMEL = 512
Layout = Callable[[torch.Tensor], torch.Tensor | None]


def _channels_last(t: torch.Tensor) -> torch.Tensor | None:
    """Dim 1 innermost (channels_last for 4-D, its 1-D/3-D analogues for 3-D/5-D)."""
    return t.movedim(1, -1).contiguous().movedim(-1, 1) if t.dim() >= 3 else None


def _transposed(t: torch.Tensor) -> torch.Tensor | None:
    return t.transpose(-1, -2).contiguous().transpose(-1, -2) if t.dim() >= 2 else None


def _sliced(t: torch.Tensor) -> torch.Tensor | None:
    return torch.stack([t, t], dim=-1)[..., 0] if t.dim() >= 1 else None


def _offset(t: torch.Tensor) -> torch.Tensor | None:
    return torch.cat([t.new_zeros(1), t.flatten()])[1:].view(t.shape) if t.numel() else None


LAYOUTS: dict[str, Layout] = {
    "channels_last": _channels_last,
    "transposed": _transposed,
    "sliced": _sliced,
    "offset": _offset,
}


@dataclass(frozen=True)
class Case:
    """An op over inputs in one layout, read in storage order by an as_strided."""

    name: str
    op: Callable[..., Any]
    layout: Layout
    tensors: tuple[torch.Tensor, ...]  # contiguous; fn puts them in the layout itself
    spec: Any  # rebuilds (input, args, kwargs) from the sample's leaves
    leaves: tuple[Any, ...]
    numel: int
    offset: int

    def output(self, *tensors: torch.Tensor) -> torch.Tensor:
        """The op's first tensor output, on ``tensors`` put in the case's layout."""
        it = iter(tensors)
        leaves = [
            self._in_layout(next(it)) if isinstance(v, torch.Tensor) else v for v in self.leaves
        ]
        x, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        out = self.op(x, *args, **kwargs)
        return (
            out
            if isinstance(out, torch.Tensor)
            else next(o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor))
        )

    def fn(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.output(*tensors).as_strided((self.numel,), (1,), self.offset)

    def _in_layout(self, t: torch.Tensor) -> torch.Tensor:
        changed = self.layout(t) if t.is_floating_point() else None
        return t if changed is None else changed


def _layouts_differ(case: Case) -> bool:
    """Whether the op's eager output layout is dense and differs from its fake one."""
    eager = Geometry.of(case.output(*case.tensors))
    if not is_one_to_one(eager) or eager.storage_extent() - eager.offset != eager.numel:
        return False  # reading it in storage order would read gaps: not a useful case
    with FakeTensorMode() as mode:
        fake = case.output(*[mode.from_tensor(t) for t in case.tensors])
    return not equivalent(eager, Geometry.of(fake))


def _case(name: str, op: Callable[..., Any], layout: Layout, sample: Any) -> Case | None:
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    tensors = tuple(v for v in leaves if isinstance(v, torch.Tensor))
    if not all(t.layout == torch.strided and t.is_contiguous() for t in tensors):
        return None
    x = sample.input
    if not isinstance(x, torch.Tensor) or x.numel() > MAX_NUMEL or layout(x) is None:
        return None
    probe = Case(name, op, layout, tensors, spec, tuple(leaves), 0, 0)
    out = probe.output(*tensors)
    return Case(name, op, layout, tensors, spec, tuple(leaves), out.numel(), out.storage_offset())


def _roll_case() -> Case:
    """The issue's program: roll of a channels_last tensor (pytorch/pytorch#174963)."""
    x = torch.arange(100.0, device=TEST_DEVICE).reshape(2, 5, 2, 5)
    leaves, spec = pytree.tree_flatten((x, (), {"shifts": -1, "dims": 0}))
    return Case("roll/channels_last", torch.roll, _channels_last, (x,), spec, tuple(leaves), 100, 0)


@functools.cache
def disagreeing_cases() -> tuple[Case, ...]:
    """One case per (op, layout) whose fake output layout is not eager's, on this torch."""
    found: list[Case] = []
    roll = _roll_case()
    if _layouts_differ(roll):
        found.append(roll)
    with warnings.catch_warnings(), torch.random.fork_rng():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)  # the same samples on every run
        for info in op_db:
            if torch.float32 not in info.supported_dtypes(TEST_DEVICE.type):
                continue
            if device_breaking_reason(info.name):  # DEVICE_BREAKING_OPS: left out there
                continue
            samples = _samples(info)
            for layout_name, layout in LAYOUTS.items():
                case = _first_case(info, f"{info.full_name}/{layout_name}", layout, samples)
                if case is not None:
                    found.append(case)
    return tuple(found)


def _samples(info: Any) -> list[Any]:
    """The entry's first samples, from its ``sample_inputs_func`` (``sample_inputs`` wraps it in
    an iterator that inspects the call stack on creation: two thirds of the sweep's time)."""
    try:
        samples = info.sample_inputs_func(info, str(TEST_DEVICE), torch.float32, False)
        return list(itertools.islice(samples, SAMPLES_PER_OP))
    except Exception as err:  # noqa: BLE001 - an entry without float32 samples there has no case
        raise_if_test_device_failed(err, f"OpInfo {info.full_name}'s samples")
        return []


def _first_case(info: Any, name: str, layout: Layout, samples: list[Any]) -> Case | None:
    for sample in samples:
        try:
            case = _case(name, info.op, layout, sample)
            if case is not None:
                return case if _layouts_differ(case) and _deterministic(case) else None
        except Exception as err:  # noqa: BLE001 - a sample eager or fake mode refuses is no case
            raise_if_test_device_failed(err, f"OpInfo {name}")
            return None
    return None


def _deterministic(case: Case) -> bool:
    """Random ops (``normal``; OpInfo seeds them in Python, which a graph does not replay)
    give other numbers on every run: nothing to compare."""
    gm = make_fx(case.fn)(*case.tensors)
    return not any(
        torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()) for n in gm.graph.nodes
    )


def _cases() -> list[Case]:
    """The end-to-end cases: one layout per op (the first found), to keep compiles few."""
    first: dict[str, Case] = {}
    for case in disagreeing_cases():
        first.setdefault(case.name.split("/")[0], case)
    return list(first.values())


def _expected(case: Case) -> torch.Tensor:
    return case.fn(*case.tensors)


def test_the_sweep_finds_disagreeing_ops_on_the_test_device() -> None:
    """The sweep is not empty on the releases we support (2.11 to 2.15 all have some), and its
    cases ran on the test device. OpInfo entries that break the device are left out there
    (tests/device_checks.py: on CUDA, the jiterator entries); a device error fails the run."""
    cases = disagreeing_cases()
    assert cases, f"no op whose fake layout differs from eager's on {TEST_DEVICE}: sweep broken?"
    assert {t.device for case in cases for t in case.tensors} == {TEST_DEVICE}


def test_trace_and_rewrite_keep_the_node_and_name_the_op() -> None:
    for case in _cases():
        gm = fxviews.trace(case.fn, *case.tensors)
        result = fxviews.rewrite(gm)
        torch.testing.assert_close(
            result.graph_module(*case.tensors), _expected(case), msg=case.name
        )
        [last] = [r for r in result.records if r.node == as_strided_nodes(gm)[-1].name]
        assert last.method == "kept" and "not eager PyTorch's" in last.reason, (case.name, last)
        assert "not eager PyTorch's" in format_result(result, width=2000)  # the printout says why
        with pytest.raises(fxviews.UnsafeAsStridedError, match="not eager PyTorch's"):
            fxviews.rewrite(gm, strict=True)


def test_explain_gives_eager_numbers() -> None:
    for case in _cases():
        result = fxviews.explain(case.fn, *case.tensors)
        torch.testing.assert_close(
            result.graph_module(*case.tensors), _expected(case), msg=case.name
        )


def test_transform_in_fake_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture_module, "_has_real_values", lambda args: False)
    for case in _cases():
        got = fxviews.transform(case.fn)(*case.tensors)
        torch.testing.assert_close(got, _expected(case), msg=case.name)


def test_transform_recorded_is_trusted() -> None:
    """A recording's layouts are real: no check, and the rewrite is right."""
    for case in _cases():
        transformed = fxviews.transform(case.fn)
        torch.testing.assert_close(transformed(*case.tensors), _expected(case), msg=case.name)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compile_backend(dynamic: bool) -> None:
    for case in _cases():
        torch._dynamo.reset()
        try:
            got = torch.compile(case.fn, backend="fxviews", dynamic=dynamic)(*case.tensors)
        except Exception as err:
            raise_if_test_device_failed(err, f"{case.name} through the backend")
            torch._dynamo.reset()
            try:  # Dynamo itself may refuse the sample: then there is nothing to check
                torch.compile(case.fn, backend="eager", dynamic=dynamic)(*case.tensors)
            except Exception as eager_err:  # noqa: BLE001
                raise_if_test_device_failed(eager_err, f"{case.name} through Dynamo")
                continue
            raise
        torch.testing.assert_close(got, _expected(case), msg=case.name)
    torch._dynamo.reset()


class _Program(torch.nn.Module):
    def __init__(self, case: Case) -> None:
        super().__init__()
        self.case = case

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.case.fn(*tensors)


def test_rewrite_of_an_exported_program() -> None:
    for case in _cases():
        try:
            ep = torch.export.export(_Program(case), case.tensors)
        except Exception as err:  # noqa: BLE001 - export itself refuses this sample
            raise_if_test_device_failed(err, f"torch.export of {case.name}")
            continue
        result = fxviews.rewrite(ep)
        got = result.exported_program.module()(*case.tensors)
        torch.testing.assert_close(got, _expected(case), msg=case.name)


def test_a_recorded_graph_is_marked_real_and_a_fake_one_is_not() -> None:
    case = _roll_case()
    gm = fxviews.trace(case.fn, *case.tensors)
    assert not gm.meta.get(REAL_LAYOUTS)
    recorded = capture_module.capture(case.fn, case.tensors, fresh=True, caller="test", name="fn")
    assert recorded.meta[REAL_LAYOUTS] is True


def test_the_issue_example_through_the_backend() -> None:
    """pytorch/pytorch#174963's program, as the issue reports it (right on every release)."""

    def func(x: torch.Tensor) -> torch.Tensor:
        return torch.roll(x, shifts=-1, dims=0).as_strided((5, 10), (4, 1), 0)

    x = torch.arange(100.0, device=TEST_DEVICE).reshape(2, 5, 2, 5)
    x = x.to(memory_format=torch.channels_last)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(func, backend="fxviews")(x), func(x))
    torch._dynamo.reset()
    gm = fxviews.trace(func, x)
    result = fxviews.rewrite(gm)
    torch.testing.assert_close(result.graph_module(x), func(x))
    if _layouts_differ(_roll_case()):
        [record] = result.records
        assert record.method == "kept" and "roll ('roll') is traced as" in record.reason
        # Pinning would give roll's memory its traced (contiguous) layout: it leaves it alone.
        [pin] = result.pin_records
        assert pin.method == "kept" and "is traced as" in pin.reason
        [node] = as_strided_nodes(gm)
        assert LAYOUT_DOUBT not in node.meta  # rewrite works on a copy: the caller's graph stays


# --- the check's own behaviour, on small graphs ----------------------------------------------


def _channels_last_roll(x: torch.Tensor) -> torch.Tensor:
    return torch.roll(x.contiguous(memory_format=torch.channels_last), shifts=-1, dims=0)


def _window(t: torch.Tensor) -> torch.Tensor:
    return t.as_strided((5, 10), (4, 1), 0)


def _roll_disagrees() -> bool:
    return _layouts_differ(_roll_case())


def test_a_difference_an_op_absorbs_is_no_doubt() -> None:
    """roll's wrong traced layout, then a contiguous clone: the window reads the clone, whose
    traced layout is eager's, so it is rewritten (and right)."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return _window(_channels_last_roll(x).clone(memory_format=torch.contiguous_format))

    x = randn(2, 5, 2, 5)
    result = fxviews.explain(fn, x)
    assert [r.method for r in result.records] == ["synthesized"]
    torch.testing.assert_close(result.graph_module(x), fn(x))


def test_an_op_that_cannot_run_leaves_the_layout_unchecked_and_the_node_kept() -> None:
    with torch.library._scoped_library("fxviews_layout_truth_test", "FRAGMENT") as library:
        library.define("twice(Tensor x) -> Tensor")
        library.impl("twice", lambda t: t * 2, "CompositeExplicitAutograd")
        library._register_fake("twice", lambda t: torch.empty_like(t))
        twice = torch.ops.fxviews_layout_truth_test.twice.default
        x = randn(2, 5, 2, 5)
        result = fxviews.explain(lambda x: _window(twice(x)), x)
        [record] = result.records
        assert record.method == "kept" and "could not be checked" in record.reason
        assert "twice" in record.reason
        torch.testing.assert_close(result.graph_module(x), _window(twice(x)))


def test_constants_and_random_ops_on_the_path() -> None:
    """A closed-over constant's layout is its own; a random op on the path runs with the
    random state restored (the check draws nothing the program would)."""
    bias = randn(5, 2, 5).contiguous(memory_format=torch.contiguous_format)

    def fn(x: torch.Tensor) -> torch.Tensor:
        noisy = torch.nn.functional.dropout(x + bias, p=0.5, training=True)
        return _window(torch.roll(noisy.contiguous(memory_format=torch.channels_last), -1, 0))

    x = randn(2, 5, 2, 5)
    gm = fxviews.trace(fn, x)
    states = rng_states()
    result = fxviews.rewrite(gm)
    assert all(torch.equal(a, b) for a, b in zip(rng_states(), states, strict=True))
    [record] = result.records
    if _roll_disagrees():
        assert record.method == "kept" and "roll ('roll') is traced as" in record.reason
    with torch.random.fork_rng():
        expected = fn(x)
    torch.testing.assert_close(result.graph_module(x), expected)


def test_agreeing_layouts_change_nothing() -> None:
    """The same program on a contiguous input: roll's layouts agree, the node is rewritten."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return _window(torch.roll(x, shifts=-1, dims=0))

    x = randn(2, 5, 2, 5)
    result = fxviews.explain(fn, x)
    assert [r.method for r in result.records] == ["synthesized"]
    torch.testing.assert_close(result.graph_module(x), fn(x))


class _RollWindow(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.roll(-1, 0).as_strided((5, 10), (4, 1), 0)  # a method call: call_method


def test_a_symbolic_trace_with_example_inputs_runs_torch_level_calls() -> None:
    """``rewrite(gm, example_inputs=...)`` of a ``torch.fx.symbolic_trace`` graph: its layouts
    come from FakeTensorProp, and its calls are torch functions and methods."""
    x = torch.arange(100.0, device=TEST_DEVICE).reshape(2, 5, 2, 5)
    x = x.to(memory_format=torch.channels_last)
    module = _RollWindow()
    gm = torch.fx.symbolic_trace(module)
    result = fxviews.rewrite(gm, example_inputs=[x])
    torch.testing.assert_close(result.graph_module(x), module(x))
    if _roll_disagrees():
        [record] = result.records
        assert record.method == "kept" and "roll ('roll') is traced as" in record.reason


def test_eager_layouts_are_computed_on_the_traced_device() -> None:
    """Each eager kernel runs on the device the graph was traced for (a CUDA kernel may lay out
    its result otherwise than the CPU one): here a graph traced on fake CUDA tensors, of a
    program whose layouts agree on CPU. Without CUDA nothing can run there, so the node is kept,
    saying why (a check on CPU would have rewritten it), and the rewrite does not fail asking
    CUDA for its random state; with CUDA the check runs there, agrees and the node is
    rewritten."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return _window(torch.roll(x, shifts=-1, dims=0))

    with FakeTensorMode():
        x = torch.empty(2, 5, 2, 5, device="cuda")
    gm = make_fx(fn)(x)
    [record] = fxviews.rewrite(gm).records
    if torch.cuda.is_available():
        assert reachable_cuda_devices([x]) == [x.device.index]
        assert record.method == "synthesized", record
    else:
        assert reachable_cuda_devices([x]) == []
        assert record.method == "kept", record
        assert "could not be checked" in record.reason and "traced device" in record.reason


def test_a_graph_traced_on_the_meta_device_keeps_what_it_cannot_check() -> None:
    """Meta kernels are the fake ones, so a check run on meta tensors would confirm the very
    layouts it checks, and a graph traced there runs on another device. roll of a
    channels_last input, traced on meta, run on CPU: the node is kept, and right."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return _window(torch.roll(x, shifts=-1, dims=0))

    x = torch.arange(100.0).reshape(2, 5, 2, 5).to(memory_format=torch.channels_last)
    result = fxviews.rewrite(make_fx(fn)(x.to("meta")))
    [record] = result.records
    assert record.method == "kept" and "meta device" in record.reason, record
    torch.testing.assert_close(result.graph_module(x), fn(x))
