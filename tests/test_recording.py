"""``transform``'s first trace: a recording on one real sample, checked against make_fx.

Every program of ``test_real_programs`` is recorded (no fall back to fake mode): each node's
value has the sizes, strides, storage offset and dtype its real result has when the graph runs
(an interpreter keeps them), the same nodes share storage, and the ``as_strided`` calls are
the ones make_fx records in fake mode. What a
recording could get wrong (values leaving the graph through ``.item()``, a branch, a boolean
mask, ``tolist``, an alias made without an op) sends the trace to fake mode, and ``vmap`` of
the transformed function still equals the program run eagerly one sample at a time.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.func import grad, jvp, vmap

import fxviews
import fxviews.tracing.capture as capture_module
from fxviews.passes.compat.torch_internals import FakeTensorMode, storage_identity
from fxviews.passes.schema import FAKE_MODE, RECORDED, TRACED_WITH
from fxviews.tracing.capture import capture
from fxviews.tracing.recording import (
    NotRecordable,
    reads_values_into_shape,
    record,
    shaped_by_metadata,
)
from tests.reference import (
    as_strided_nodes,
    assert_tree_close,
    assert_vmap_matches_per_sample,
    make_samples,
)
from tests.test_real_programs import PROGRAMS, Program


def _capture(fn: Callable[..., Any], args: list[Any]) -> torch.fx.GraphModule:
    return capture(fn, args, fresh=True, caller="test", name="fn")


def _fake_capture(
    fn: Callable[..., Any], args: list[Any], monkeypatch: pytest.MonkeyPatch
) -> torch.fx.GraphModule:
    with monkeypatch.context() as patched:
        patched.setattr(capture_module, "_has_real_values", lambda args: False)
        return _capture(fn, args)


def _flat(program: Program) -> tuple[Callable[..., Any], list[torch.Tensor]]:
    """``program.fn`` over its sample's tensors, returning its output tensors as a list."""
    sample = program.sample(0)
    leaves, spec = torch.utils._pytree.tree_flatten(sample)

    def fn(*tensors: torch.Tensor) -> list[Any]:
        return torch.utils._pytree.tree_leaves(
            program.fn(*torch.utils._pytree.tree_unflatten(list(tensors), spec))
        )

    return fn, [leaf.detach().clone() for leaf in leaves]


class _Layouts:
    """Tensors' sizes, strides, offsets and dtypes, and their storages as first-seen indices."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[Any, ...]] = {}
        self._storages: dict[int, int] = {}

    def add(self, node: torch.fx.Node, value: Any) -> None:
        if isinstance(value, torch.Tensor) and node.op != "get_attr":
            storage = self._storages.setdefault(storage_identity(value), len(self._storages))
            layout = (value.shape, value.stride(), value.storage_offset(), value.dtype, storage)
            self.rows[node.name] = layout


class _RealLayouts(torch.fx.Interpreter):
    """Runs a graph on real tensors, taking each result's layout as its node produces it (a
    later ``squeeze_`` changes the tensor, not what the node gave)."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        # Every result stays alive, so no storage address is reused within the run.
        super().__init__(gm, garbage_collect_values=False)
        self.layouts = _Layouts()

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super().run_node(n)
        self.layouts.add(n, result)
        return result


def _strided_calls(gm: torch.fx.GraphModule) -> list[tuple[Any, ...]]:
    return [(node.target, *node.args[1:]) for node in as_strided_nodes(gm)]


#: Programs a recording leaves to fake mode: ``torch.func.linearize`` runs make_fx itself, whose
#: fake tensors pass storages as op arguments.
_TRACED_WITH = {"linearize_cumsum": FAKE_MODE}


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_recording_gives_each_node_its_real_layout(
    program: Program, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recorded, not traced in fake mode; each node's value has the layout and aliasing its
    real result has when the graph runs; the as_strided calls are make_fx's (fake mode)."""
    fn, args = _flat(program)
    recorded = _capture(fn, args)
    assert recorded.meta[TRACED_WITH] == _TRACED_WITH.get(program.name, RECORDED)
    interpreter = _RealLayouts(recorded)
    with torch.random.fork_rng():
        interpreter.run(*[arg.clone() for arg in args])
    recorded_layouts = _Layouts()
    for node in recorded.graph.nodes:
        recorded_layouts.add(node, node.meta.get("val"))
    assert recorded_layouts.rows == interpreter.layouts.rows
    faked = _fake_capture(fn, args, monkeypatch)
    assert faked.meta[TRACED_WITH] == FAKE_MODE
    assert _strided_calls(recorded) == _strided_calls(faked)


def _shift(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[1:] = y[:-1] * 2
    return y.sum(0)


def _item_as_value(x: torch.Tensor) -> torch.Tensor:
    return grad(lambda a: (_shift(a) * a.max().item()).sum())(x)


def _tolist_as_value(x: torch.Tensor) -> torch.Tensor:
    return _shift(x) * sum(x[0].tolist())


def _mask_select(x: torch.Tensor) -> torch.Tensor:
    return _shift(x)[x[0] > 0].sum() + x.sum()


def _integer_index(x: torch.Tensor) -> torch.Tensor:
    index = torch.tensor([2, 0, 1])
    return jvp(lambda a: _shift(a)[index], (x,), (torch.ones_like(x),))[1]


@pytest.mark.parametrize(
    ("fn", "traced_with"),
    [
        (_item_as_value, FAKE_MODE),
        (_tolist_as_value, FAKE_MODE),  # eager vmap refuses it (.item() per element)
        (_mask_select, FAKE_MODE),  # eager vmap refuses a boolean mask
        (_integer_index, RECORDED),
    ],
    ids=lambda value: getattr(value, "__name__", str(value)),
)
def test_what_a_recording_cannot_vouch_for_goes_to_fake_mode(
    fn: Callable[..., Any], traced_with: str
) -> None:
    assert _capture(fn, [torch.randn(4, 3)]).meta[TRACED_WITH] == traced_with
    samples = make_samples([(4, 3)], 3, seed=5)
    transformed = fxviews.transform(fn)
    for (sample,) in samples:
        assert_tree_close(transformed(sample), fn(sample))
    if fn not in (_tolist_as_value, _mask_select):
        assert_vmap_matches_per_sample(transformed, fn, samples)


def test_recording_leaves_random_state_and_closed_over_buffers_as_they_were() -> None:
    buffer = torch.zeros(3)

    def fn(x: torch.Tensor) -> torch.Tensor:
        buffer.add_(1)  # a write the graph repeats on every call: the trace must not add one
        return _shift(x) + torch.rand(3) + buffer

    x = torch.randn(4, 3)
    state = torch.get_rng_state()
    gm = _capture(fn, [x])
    assert gm.meta[TRACED_WITH] == RECORDED
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(buffer, torch.zeros(3))
    gm(torch.randn(4, 3))
    assert torch.equal(buffer, torch.ones(3))


def test_recorded_graph_holds_closed_over_parameters_by_reference() -> None:
    weight = torch.nn.Parameter(torch.randn(3, 3))
    transformed = fxviews.transform(lambda x: _shift(x @ weight))
    x = torch.randn(2, 4, 3)
    transformed(x[0])
    with torch.no_grad():
        weight.mul_(2)
    assert torch.allclose(vmap(transformed)(x), vmap(lambda s: _shift(s @ weight))(x))


def test_value_dependent_shapes_are_told_from_index_shapes() -> None:
    index = torch.ops.aten.index.Tensor
    x = torch.ones(3)
    assert reads_values_into_shape(index, (x, [torch.tensor([True, False, True])]))
    assert reads_values_into_shape(index, (x, [None, torch.tensor([1], dtype=torch.uint8)]))
    assert not reads_values_into_shape(index, (x, [torch.tensor([2, 0])]))
    assert reads_values_into_shape(torch.ops.aten.nonzero.default, (x,))
    assert reads_values_into_shape(torch.ops.aten._local_scalar_dense.default, (x,))
    assert not reads_values_into_shape(torch.ops.aten.add.Tensor, (x, x))


def test_only_ops_shaped_by_metadata_are_recorded() -> None:
    """Untagged ops that read values below the dispatcher (``_pack_padded_sequence`` sizes its
    result by ``lengths``) and a library's ops are left to fake mode."""
    x, lengths = torch.randn(4, 2, 3), torch.tensor([4, 2])
    pack = torch.ops.aten._pack_padded_sequence.default
    assert not shaped_by_metadata(pack, (x, lengths, False), {}, pack(x, lengths, False))
    assert shaped_by_metadata(torch.ops.aten.t.default, (x[0],), {}, x[0].t())  # a Meta kernel
    expand = torch.ops.aten.expand.default  # no Meta kernel: run once on meta tensors
    assert shaped_by_metadata(expand, (x[0, 0], [2, 3]), {}, x[0, 0].expand(2, 3))
    with torch.library._scoped_library("fxviews_recording_test", "FRAGMENT") as library:
        library.define("double(Tensor x) -> Tensor")
        library.impl("double", lambda t: t * 2, "CompositeExplicitAutograd")
        double = torch.ops.fxviews_recording_test.double.default
        assert not shaped_by_metadata(double, (x,), {}, double(x))

    def packed(x: torch.Tensor) -> torch.Tensor:
        sequence = torch.nn.utils.rnn.pack_padded_sequence(_shift(x), torch.tensor([3, 1]))
        return sequence.data.sum(0)

    x = torch.randn(4, 2, 3)
    assert _capture(packed, [x]).meta[TRACED_WITH] != RECORDED


def test_record_refuses_memory_reads_aliases_made_without_ops_and_meta_tensors() -> None:
    mode = FakeTensorMode()
    x = torch.ones(2, 3)
    alias = x.view(-1)  # made before the recording: no op the recorder saw
    with pytest.raises(NotRecordable, match="aliasing"):
        record(lambda x: [x + alias.view(2, 3)], [x], mode)
    assert record(lambda x: [x.view(-1) + 1], [x], mode).meta == {}  # made by an op: fine
    with pytest.raises(NotRecordable, match="numpy"):
        record(lambda x: [x + torch.from_numpy(x.numpy())], [torch.ones(2)], mode)
    with pytest.raises(NotRecordable, match="meta"):
        record(lambda x: [x.to("meta")], [torch.ones(2)], mode)


def test_a_refused_recording_inside_jvp_leaves_later_transforms_working() -> None:
    """The refusal unwinds through jvp's levels; nothing collected later exits them again."""
    x = torch.randn(4, 3)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return jvp(lambda a: (_shift(a) * a.max().item()).sum(0), (x,), (torch.ones_like(x),))[1]

    for _ in range(2):
        assert _capture(fn, [x]).meta[TRACED_WITH] == FAKE_MODE
        gc.collect()
        tangent = jvp(torch.sin, (x,), (torch.ones_like(x),))[1]
        assert torch.allclose(tangent, x.cos())
        assert torch.allclose(grad(lambda a: a.sin().sum())(x), x.cos())


class _Tagged(torch.Tensor):
    """A tensor subclass: its ops dispatch through it, above any recording."""


def test_subclass_and_meta_inputs_trace_in_fake_mode() -> None:
    x = torch.randn(4, 3)
    assert _capture(_shift, [x.as_subclass(_Tagged)]).meta[TRACED_WITH] == FAKE_MODE
    assert _capture(_shift, [x.to("meta")]).meta[TRACED_WITH] == FAKE_MODE
    assert _capture(_shift, [torch.nn.Parameter(x)]).meta[TRACED_WITH] == RECORDED
