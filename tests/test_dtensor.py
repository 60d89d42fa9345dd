"""fxviews.dtensor in real gloo worlds of 2 and 4 CPU processes (see tests/dtensor_battery.py).

Each world is spawned once per module and runs every check and case inside (the world of 4
eagerly only: four processes compile slowly on a small machine); the tests below
assert rank 0's results: ``full_tensor()`` equal to the function on the whole tensor, the output
placement written by hand per case, PyTorch's own behaviour before register() and after
unregister(), the refusal of a request outside the tensor, and the redistribution message.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch.distributed as dist

from fxviews.passes.compat.torch_internals import TORCH_RELEASE
from tests import dtensor_battery as battery

if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

PYTORCH_AS_STRIDED_ERROR = "as_strided not supported with DTensor"
PYTORCH_UNFOLD_ERROR = "Operator aten.unfold.default does not have a sharding strategy registered"
DTENSOR_FLATTEN_REFUSAL = "RuntimeError: ('Attempted to flatten multiple dimensions"


@pytest.fixture(scope="module")
def world_2():
    extra = (("compiled_alias", battery.compiled_alias_checks),)
    return battery.in_world(2, battery.WorldJob(battery.case_modes, extra))


@pytest.fixture(scope="module")
def world_4():
    extra = (("mesh_2d", battery.mesh_2d_checks), ("training", battery.training_checks))
    return battery.in_world(4, battery.WorldJob(battery.eager_only, extra))


def _params(modes_of):
    return [
        pytest.param(case, mode, id=f"{case.id}-{battery.mode_name(mode)}")
        for case in battery.CASES
        for mode in modes_of(case)
    ]


def _outcome(world, case, mode):
    (outcome,) = [
        o for o in world["outcomes"] if o.case == case.id and o.mode == battery.mode_name(mode)
    ]
    return outcome


def _check(outcome, case, mode):
    if mode in case.upstream and not outcome.ran:
        # PyTorch's own failure (torch 2.13); a release that fixes it must give the right answer.
        assert battery.INDUCTOR_DYNAMIC_BUG in outcome.error, f"a new failure: {outcome}"
        return
    assert outcome.ran, outcome.error
    assert outcome.matches, "full_tensor() differs from the function on the whole tensor"
    if mode in case.may_replicate and outcome.placement == "R":
        return
    assert outcome.placement == case.expected


@pytest.mark.parametrize(("case", "mode"), _params(battery.case_modes))
def test_world_of_2(world_2, case, mode):
    _check(_outcome(world_2, case, mode), case, mode)


@pytest.mark.parametrize(("case", "mode"), _params(battery.eager_only))
def test_world_of_4(world_4, case, mode):
    _check(_outcome(world_4, case, mode), case, mode)


def test_pytorch_alone_refuses_as_strided_and_unfold(world_2):
    as_strided_error, unfold_error = world_2["checks"]["errors_before"]
    assert PYTORCH_AS_STRIDED_ERROR in as_strided_error
    assert PYTORCH_UNFOLD_ERROR in unfold_error


def test_register_installs_the_handler_and_strategies_and_twice_is_once(world_2):
    checks = world_2["checks"]
    assert checks["registered"]
    # the handler; strategies and cache keys of unfold, diagonal and their backwards; the shape
    # arguments of the backwards
    assert checks["changed"] == [True] * 11
    assert checks["twice_is_once"]
    assert checks["errors_during"] == ("", "")


def test_unregister_restores_pytorch_exactly(world_2):
    checks = world_2["checks"]
    assert checks["restored"] == [True] * 11  # the very objects DTensor had, or still absent
    assert checks["unregistered"]
    assert checks["errors_after"] == checks["errors_before"]


def test_a_request_outside_the_tensor_is_refused_naming_its_geometry(world_2):
    kind, message = world_2["checks"]["refusal"]
    assert kind == "AsStridedRequestError"
    assert "sizes=[8, 8] strides=[7, 1] offset=0" in message
    assert "sizes=[8, 7] strides=[7, 1] offset=0" in message  # the global tensor
    assert "does not expose" in message


def test_an_offset_other_than_a_views_reported_one_is_refused(world_2):
    offsets = world_2["checks"]["offsets"]
    assert offsets["reported"] == 3  # x[1:] of (8, 6) on Shard(1), 2 ranks: one local row of 3
    assert offsets["same offset right"]
    kind, message = offsets["other offset"]
    assert kind == "FxViewsError" and "ambiguous" in message and "reports offset 3" in message


def test_pytorchs_as_strided_backward_on_a_dtensor_is_refused(world_2):
    kind, message = world_2["checks"]["offsets"]["aten backward"]
    assert "as_strided backward cannot run on a DTensor" in message, (kind, message)


def test_crossing_the_sharded_dim_is_said_once(world_2):
    log = world_2["checks"]["log"]
    assert len(log) == 1, log
    assert "redistributed" in log[0] and "Shard(dim=0)" in log[0] and "unfold" in log[0]


@pytest.mark.parametrize("how", ["", " x.as_strided"])
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize(("name", "placements"), [(n, p) for n, _, p in battery.GRADIENT_CASES])
def test_gradients_through_as_strided(world_2, world_4, world_size, name, placements, how):
    """fxviews.as_strided(x, ...) and, after register(), x.as_strided(...) itself."""
    world = world_2 if world_size == 2 else world_4
    found = {(p, out): equal for n, p, out, equal in world["gradients"] if n == name + how}
    assert found == {(p, out): True for p, out in placements.items()}


#: Compiled outputs DTensor computes from a redistributed copy of the input (its slice of a
#: sharded dim replicates): with gradients to the input they cannot be remade as an alias.
REDISTRIBUTED_VIEWS = {"x[1:] S0 grad", "x[1] S0 grad", "x[:, 2:] S1 grad"}


@pytest.mark.parametrize(
    "case",
    [
        f"{name} {placement}{grad}"
        for name in battery.ALIAS_FUNCTIONS
        for placement in ("S0", "S1", "R")
        for grad in ("", " grad")
    ],
)
def test_compiled_outputs_aliasing_a_dtensor_input(world_2, case):
    """AOTAutograd remakes them with gen_alias_from_base: right values and gradients, or, where
    gradients cannot flow through a redistributed copy, FxViewsError saying so."""
    found = world_2["compiled_alias"][case]
    if case in REDISTRIBUTED_VIEWS:
        assert found.startswith("FxViewsError") and "redistributed copy" in found, found
    else:
        assert found == "right"


def test_a_graph_compiled_before_register_is_refused_not_misread(world_2):
    found = world_2["compiled_alias"]
    assert PYTORCH_AS_STRIDED_ERROR in found["compiled before register, unregistered"]
    after = found["compiled before register, registered"]
    if TORCH_RELEASE >= (2, 13):
        # The compiled wrapper's code holds PyTorch's gen_alias_from_base, bound when it was made.
        assert after.startswith("FxViewsError") and "torch._dynamo.reset()" in after, after
    else:
        # It looks the function up in runtime_wrappers on each call: register() reaches it too.
        assert after == "right"


def test_2d_mesh_every_placement_pair_is_right_or_refused(world_4):
    """A 2 x 2 mesh, every placement pair, strided shards from reshapes: never a wrong value
    or gradient; the errors are DTensor's own (see docs/dtensor.md)."""
    found = world_4["mesh_2d"]
    assert len(found) == len(battery.MESH_2D_FUNCTIONS) * len(battery.MESH_2D_PLACEMENTS)
    wrong = {case: outcome for case, outcome in found.items() if outcome.startswith("wrong")}
    assert not wrong
    # Before torch 2.13 DTensor cannot flatten a sharded dim with another: the user's own
    # reshape, view or flatten raises, before any as_strided reaches fxviews.
    refused_by_dtensor = {c for c, o in found.items() if o.startswith(DTENSOR_FLATTEN_REFUSAL)}
    assert not refused_by_dtensor or TORCH_RELEASE < (2, 13), refused_by_dtensor
    reached = {c: o for c, o in found.items() if c not in refused_by_dtensor}
    right = [case for case, outcome in reached.items() if outcome == "right"]
    assert len(right) >= 0.9 * len(reached), {c: o for c, o in reached.items() if o != "right"}


def test_fxviews_dtensor_is_imported_on_first_use():
    code = (
        "import sys, fxviews; assert 'fxviews.consumers.dtensor' not in sys.modules; "
        "fxviews.dtensor.register; assert 'fxviews.consumers.dtensor' in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("op", "args", "shape", "dims"),
    [
        ("unfold", (1, 3, 1), (4, 6), {1}),
        ("select", (0, 2), (4, 6), {0}),
        ("slice", (2, 1, 5, 2), (4, 6, 6), {2}),
        ("diagonal", (0, 1, 2), (4, 5, 5), {1, 2}),
        ("view", ([4, 2, 3],), (4, 6), {1}),  # splits dim 1 only
        ("view", ([4, 36],), (4, 6, 6), {1, 2}),  # merges dims 1 and 2
        ("view", ([4, 3, 2, 6],), (4, 6, 6), {1}),
        ("expand", ([3, 4, 6],), (1, 4, 6), {0}),
        ("permute", ([1, 0],), (4, 6), set()),
        ("unsqueeze", (0,), (4, 6), set()),
    ],
)
def test_the_dims_a_step_reindexes(op, args, shape, dims):
    import torch

    from fxviews.consumers.dtensor import reindexed_dims
    from fxviews.passes.chains.chain import ViewStep

    overload = {
        "unfold": torch.ops.aten.unfold.default,
        "select": torch.ops.aten.select.int,
        "slice": torch.ops.aten.slice.Tensor,
        "diagonal": torch.ops.aten.diagonal.default,
        "view": torch.ops.aten.view.default,
        "expand": torch.ops.aten.expand.default,
        "permute": torch.ops.aten.permute.default,
        "unsqueeze": torch.ops.aten.unsqueeze.default,
    }[op]
    assert reindexed_dims(ViewStep(overload, args), shape) == dims


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_fsdp2_and_tensor_parallel_training_step_equals_one_process(world_4, mode):
    """FSDP2 on dp and ColwiseParallel on tp of a 2 x 2 mesh, attention over Longformer chunks
    (view + x.as_strided), eagerly and under torch.compile(aot_eager): one SGD step's loss and
    updated parameters equal one process's."""
    training = world_4["training"]
    assert training[mode]["loss"] == pytest.approx(training["reference_loss"], rel=1e-5)
    parameters = training[mode]["parameters"]
    assert set(parameters) == {"q.weight", "k.weight", "v.weight"}
    for placements, equal in parameters.values():
        assert equal
        assert "Replicate" not in placements  # sharded on both mesh dims, as FSDP2 + TP leave them
