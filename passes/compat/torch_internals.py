"""Every private PyTorch internal fxviews touches, in one place.

PyTorch may move or rename any of these in a release, without deprecation. The rest of fxviews,
engine and front door alike, imports them from here only, so supporting a new release is a
change to this file, and the test suite resolves each name through it, so a rename fails loudly.

Names bound at import are ones ``import torch`` (or ``import fxviews``) loads anyway. Dynamo,
AOTAutograd and Inductor take seconds to import and only the torch.compile backend needs them:
their internals resolve on first use, through the module ``__getattr__``. Each entry says what
fxviews uses it for and the first release that has it in the form used here; fxviews itself is
tested on the releases in its declared range (see the README).

Example::

    >>> from fxviews.passes.compat.torch_internals import storage_identity
    >>> x = torch.zeros(4)
    >>> storage_identity(x[1:]) == storage_identity(x)
    True
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import types
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, Literal, NamedTuple

import torch

from .older_releases import (
    TORCH_RELEASE,
    close_abandoned_checkpoints,
    inductor_decompositions,
    last_node,
    pop_functorch_layers_to,
    traceable_jacobian_basis,
)

#: The torch releases fxviews is tested on; named in every error about a missing internal.
SUPPORTED_TORCH = ">=2.11,<2.16"


def missing_internal_error(path: str, cause: BaseException) -> ImportError:
    """The error for an internal ``path`` (``module.attribute``) this torch does not provide."""
    return ImportError(
        f"fxviews needs the PyTorch internal {path}, which torch {torch.__version__} does not "
        f"provide ({cause}). fxviews supports torch {SUPPORTED_TORCH}."
    )


try:
    # pytree flattening of arguments and results (the cache key, the graph's output spec). 1.8.
    import torch.utils._pytree as pytree
    from torch._C import Argument as SchemaArgument

    # Bookkeeping inside a torch function mode's handler, below the other modes (the recording's
    # refusal of Python reads of storages among them), and tensor attributes read with no mode
    # or subclass in between: DisableTorchFunction, 2.0.
    from torch._C import DisableTorchFunction as no_torch_function
    from torch._C import (
        _dispatch_tls_local_exclude_set as dispatch_tls_exclude_set,
    )
    from torch._C import (
        _dispatch_tls_local_include_set as dispatch_tls_include_set,
    )

    # Tensors without memory a trace could write: efficient zero tensors, storage-less ones.
    # 1.13.
    from torch._C import _has_storage as has_storage
    from torch._C import (
        _is_fwd_grad_enabled as is_fwd_grad_enabled,
    )
    from torch._C import (
        _is_view_replay_enabled as is_view_replay_enabled,
    )
    from torch._C import (
        _len_torch_dispatch_stack as dispatch_mode_depth,
    )
    from torch._C import (
        _len_torch_function_stack as function_mode_depth,
    )
    from torch._C import (
        _pop_torch_dispatch_stack as pop_dispatch_mode,
    )
    from torch._C import (
        _pop_torch_function_stack as pop_function_mode,
    )
    from torch._C import (
        _PreserveDispatchKeyGuard as PreserveDispatchKeyGuard,
    )
    from torch._C import (
        _set_fwd_grad_enabled as set_fwd_grad_enabled,
    )
    from torch._C import (
        _set_view_replay_enabled as set_view_replay_enabled,
    )

    # Dynamo's frame hook's plan for a code object (set_code_exec_strategy, with a
    # _FrameExecStrategy of two _FrameActions: for its frame, and for every frame it calls).
    # As of 2.13. See run_outside_dynamo.
    from torch._C._dynamo.eval_frame import _FrameAction as FrameAction
    from torch._C._dynamo.eval_frame import _FrameExecStrategy as FrameExecStrategy
    from torch._C._dynamo.eval_frame import set_code_exec_strategy

    # Dynamo's C++ guards, 2.1. GlobalStateGuard: what they check of the process state before
    # reusing a graph (grad mode, autocast per device, default dtype, deterministic algorithms,
    # TF32/reduced-precision matmul flags, torch function mode, thread count), snapshot and
    # checked in ~0.2 us; transform's cache guards on the same set. TensorGuards: that tensors
    # are of an example's kind (Python type, dispatch keys, dtype, device, requires_grad,
    # sizes; strides where given); transform's hot call checks its tensors with it, ~80 ns each.
    from torch._C._dynamo.guards import GlobalStateGuard, TensorGuards

    # What a failed trace can leave changed, and the tracer restores (fxviews.tracing.torch_state):
    # functorch's transform stack (get_dynamic_layer_stack_depth; its undo, 2.0, is
    # older_releases.pop_functorch_layers_to) and in-place flag, 2.0; the dispatch and
    # function mode stacks, 2.0; forward-grad mode, 1.13; view replay, 2.0; the thread-local
    # dispatch key sets and the guard that restores them (_PreserveDispatchKeyGuard), 2.1.
    from torch._C._functorch import (
        get_dynamic_layer_stack_depth as functorch_layer_depth,
    )

    # A real-mode trace takes one sample's values from an argument a transform wrapped: unwrap
    # a level (get_unwrapped), and the batch dim of a vmapped one (is_batchedtensor,
    # maybe_get_bdim). 2.0. The innermost active torch.func transform (peek_interpreter_stack,
    # None outside all): a recording keeps a composite call as one node only outside them. 2.0.
    # A layout-deciding call on a functionalized tensor is left as traced (Note [Layout
    # decisions at run time]): is_functionaltensor, 2.0.
    from torch._C._functorch import (
        get_inplace_requires_grad_allowed,
        get_unwrapped,
        is_batchedtensor,
        is_functionaltensor,
        is_functorch_wrapped_tensor,
        maybe_get_bdim,
        peek_interpreter_stack,
        set_inplace_requires_grad_allowed,
    )

    # The functorch interpreter stack: transform traces outside every active torch.func
    # transform (temporarily_clear_interpreter_stack, 2.1) and refuses closures over tensors a
    # transform wrapped (is_functorch_wrapped_tensor, 2.0).
    from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack

    # The compile id of the graph being compiled, named in the backend's printouts. 2.2.
    from torch._guards import CompileContext

    # Which ops the dead-code step may erase: random, in-place and side-effecting ones never
    # (is_impure, 2.6).
    from torch._library.utils import is_impure

    # Aten operator overloads and their schemas (OpOverload, 1.12; its schema's Argument, 1.0):
    # which ops are views, which arguments a call aliases or writes.
    from torch._ops import OpOverload

    # Contiguous strides for given sizes, used to build a scatter buffer's geometry. 1.13.
    from torch._prims_common import make_contiguous_strides_for

    # Dispatch modes: fake tensors for tracing (FakeTensorMode) and the errors make_fx raises on
    # value-dependent output (*Exception), 1.13; step out of every active mode while the engine
    # verifies chains on meta tensors and while transform traces (_disable_current_modes), 2.0.
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        FakeTensor,
        FakeTensorMode,
    )

    # Autograd's view replay, under which forward AD records the user's own view ops instead of
    # as_strided (the tracer's view_replay=True option). 2.0.
    from torch.autograd import _force_original_view_tracking as force_original_view_tracking
    from torch.autograd import forward_ad as _forward_ad

    # A GraphModule that generates its code on first use, not at construction: a copy of a
    # graph that is rewritten before any code of it is needed is generated once. 2.3.
    from torch.fx._lazy_graph_module import _LazyGraphModule as LazyGraphModule

    # The tracer (make_fx, fake mode since 1.13), its symbolic shapes for .item() and boolean
    # masks (ShapeEnv, 1.13) and its error on Python control flow over tensor values
    # (GuardOnDataDependentSymNode, 2.1).
    # The node make_fx made for a result (the active proxy mode, and the proxy of a tensor
    # under its tracer): the tracer notes the user's source line on as_strided nodes. 2.1.
    # A call make_fx keeps as one node (a custom autograd.Function's apply): its own work run
    # with the proxy modes off (disable_proxy_modes_tracing), its results bound to the node's
    # proxy (track_tensor_tree), as higher-order ops do. 2.1.
    # A node make_fx did not make, bound to a result (track_tensor_tree, 2.0) with the proxy
    # mode off, as make_fx binds them (disable_proxy_modes_tracing, 2.0): the layout-deciding
    # calls fxviews records as their aten ops (Note [Layout decisions at run time]).
    from torch.fx.experimental.proxy_tensor import (
        disable_proxy_modes_tracing,
        get_proxy_mode,
        get_proxy_slot,
        make_fx,
        track_tensor_tree,
    )
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, ShapeEnv

    # The FX pass infrastructure the engine's passes plug into (PassBase, PassResult). 1.13.
    from torch.fx.passes.infra.pass_base import PassBase, PassResult

    # Run a view op's own kernel on a fake tensor's meta storage, below every mode: the emitted
    # nodes' fake values without a FakeTensorMode dispatch each (no_dispatch, 1.10).
    from torch.utils._mode_utils import no_dispatch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._python_dispatch import _disable_current_modes as disable_current_modes

    # The dispatch modes active now, innermost last (_get_current_dispatch_mode_stack, 2.0):
    # finds the recording a layout-deciding call is made under.
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack as dispatch_modes
except ImportError as err:
    # A name missing from a module that exists: err.name is that module, the message names both.
    raise missing_internal_error(err.name or "a torch module", err) from err


# Fake mode's error for an op over fake tensors on two devices (in a trace: forward AD's zero
# tangents on the meta device beside a primal on the traced one, through layer_norm/batch_norm).
# A class of its own, FakeTensorDeviceMismatchError, from 2.13; before (2.0-2.12) a RuntimeError
# whose message starts as below.
_device_mismatch_error: type[RuntimeError] | None
try:
    from torch._subclasses.fake_tensor import (
        FakeTensorDeviceMismatchError as _device_mismatch_error,
    )
except ImportError:
    _device_mismatch_error = None
_DEVICE_MISMATCH_MESSAGE = "Unhandled FakeTensor Device Propagation for "


def is_fake_device_mismatch(err: BaseException) -> bool:
    """Whether ``err`` is fake mode's refusal of an op over tensors on two devices.

    Example::

        >>> with FakeTensorMode():
        ...     cpu, meta = torch.empty(2), torch.empty(2, device="meta")
        ...     try:
        ...         cpu + meta
        ...     except RuntimeError as err:
        ...         is_fake_device_mismatch(err)
        True
    """
    if _device_mismatch_error is not None:
        return isinstance(err, _device_mismatch_error)
    return isinstance(err, RuntimeError) and str(err).startswith(_DEVICE_MISMATCH_MESSAGE)


def _aten_overload(name: str) -> OpOverload:
    """The default overload of the private aten operator ``name``."""
    try:
        return getattr(torch.ops.aten, name).default
    except AttributeError as err:
        raise missing_internal_error(f"torch.ops.aten.{name}.default", err) from err


# Private aten operators the engine recognises by name.
# forward AD's metadata check, dead after tracing: hygiene removes it. 1.11.
has_same_storage_numel = _aten_overload("_has_same_storage_numel")
# dtype/device conversion; to the meta device it is a dead copy hygiene removes. 1.10.
to_copy = _aten_overload("_to_copy")
# Forward AD's zero tangent of an input without one (a memoryless ZeroTensor). 1.11.
efficient_zero_tensor = _aten_overload("_efficientzerotensor")
# ``Tensor.item()`` as make_fx records it: a 0-dim tensor's value as a Python number. 1.9.
local_scalar_dense = _aten_overload("_local_scalar_dense")
# A runtime check of a size condition, as deferred runtime asserts emit it (2.2): bounded
# reads assert their in-bounds condition with it.
assert_scalar = _aten_overload("_assert_scalar")
# Merging views the reshape step turns into reshape (_unsafe_view 1.0, _reshape_alias 1.11).
unsafe_view = _aten_overload("_unsafe_view")
reshape_alias = _aten_overload("_reshape_alias")


# Layout-assuming kernels the pinning step gives contiguous arguments (measured; see pinning).
# SDPA's flash kernel for CPU and its backward, 2.1; embedding_bag's, 1.9; det/slogdet's LU,
# 1.13; pdist's, 1.0.
flash_attention_cpu = _aten_overload("_scaled_dot_product_flash_attention_for_cpu")
flash_attention_cpu_backward = _aten_overload(
    "_scaled_dot_product_flash_attention_for_cpu_backward"
)
embedding_bag_forward_only = _aten_overload("_embedding_bag_forward_only")
embedding_bag = _aten_overload("_embedding_bag")
linalg_det = _aten_overload("_linalg_det")
linalg_slogdet = _aten_overload("_linalg_slogdet")
pdist_forward = _aten_overload("_pdist_forward")
pdist_backward = _aten_overload("_pdist_backward")


def python_dual_level() -> int:
    """The forward-AD level ``torch.autograd.forward_ad.dual_level`` entered last (-1: none)."""
    return _forward_ad._current_level


def set_python_dual_level(level: int) -> None:
    """Reset the level :func:`python_dual_level` reads (restored after a failed trace)."""
    _forward_ad._current_level = level


def is_zerotensor(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is an efficient zero tensor (forward AD's zero tangents), 1.11."""
    return tensor._is_zerotensor()


def graph_pytree_info(graph: torch.fx.Graph) -> Any:
    """The pytree calling convention make_fx gives a graph over nested inputs, or None.

    ``graph._codegen.pytree_info`` (``orig_args``, ``in_spec``), 1.13.
    """
    return getattr(graph._codegen, "pytree_info", None)


def has_plain_codegen(graph: torch.fx.Graph) -> bool:
    """Whether ``graph`` generates FX's plain calling convention (``forward(self, *inputs)``
    returning its output as it is): ``graph._codegen`` is an exact ``CodeGen``, 1.13.
    """
    return type(graph._codegen) is torch.fx.graph.CodeGen


def install_graph(graph_module: torch.fx.GraphModule, graph: torch.fx.Graph) -> None:
    """Make ``graph`` the graph of ``graph_module`` without generating its code.

    What the ``GraphModule.graph`` setter does (``_graph``, ``owning_module``, 1.8) minus its
    ``recompile()``: for a caller that edits the graph further and recompiles once at the end.
    """
    graph_module._graph = graph
    graph.owning_module = graph_module


def run_outside_dynamo(fn: types.FunctionType, reason: str) -> None:
    """Keep Dynamo out of ``fn`` as ``torch.compiler.disable`` would, at no cost per call.

    Dynamo graph-breaks at a call of a function marked ``_torchdynamo_disable`` (naming
    ``_torchdynamo_disable_msg``: the marks ``torch.compiler.disable`` puts on its wrappers,
    2.1), and runs the code of ``fn``, and every frame it calls, as plain Python (a SKIP, SKIP
    frame plan for ``fn.__code__``, as of 2.13). Unlike that wrapper, which switches Dynamo's
    frame hook off and on around every call (~0.6 us), nothing runs when ``fn`` is called.
    """
    set_code_exec_strategy(fn.__code__, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))
    fn._torchdynamo_disable = True  # type: ignore[attr-defined]
    fn._torchdynamo_disable_msg = reason  # type: ignore[attr-defined]


def op_schema(op: OpOverload) -> torch._C.FunctionSchema:
    """The schema of an aten operator overload (its ``_schema``, 1.12).

    Example::

        >>> [a.name for a in op_schema(torch.ops.aten.select.int).arguments]
        ['self', 'dim', 'index']
    """
    return op._schema


def has_meta_kernel(op: OpOverload) -> bool:
    """Whether ``op`` has a kernel registered for the Meta dispatch key
    (``_dispatch_has_kernel_for_dispatch_key``, 1.13).

    Example::

        >>> has_meta_kernel(torch.ops.aten.mm.default)
        True
    """
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "Meta")


def has_composite_implicit_kernel(op: OpOverload) -> bool:
    """Whether ``op`` has a CompositeImplicitAutograd kernel: it decomposes above the
    dispatcher, so a trace sees only the ops it decided on (the tests' search for
    layout-deciding ops; ``_dispatch_has_kernel_for_dispatch_key``, 1.13).

    Example::

        >>> has_composite_implicit_kernel(torch.ops.aten.reshape.default)
        True
    """
    key = "CompositeImplicitAutograd"
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)
    except RuntimeError:  # a TorchScript-only overload (aten::acos.int): not in the dispatcher
        return False


def storage_identity(tensor: torch.Tensor) -> int:
    """An id shared by exactly the tensors that view the same storage, meta tensors included.

    The address of the storage's C++ object (``untyped_storage()._cdata``, 2.0): views share it,
    copies never do, whatever their geometry.
    """
    return tensor.untyped_storage()._cdata


def forget_static_evaluations(shape_env: ShapeEnv) -> None:
    """Drop the ShapeEnv's caches of what it evaluates without adding guards (its axioms,
    ``_maybe_evaluate_static``): 2.13 clears them on a new replacement, divisibility fact or
    runtime assert, not on a new guard, so a proof asked before a guard was recorded would be
    answered without it ever after. The caches are ShapeEnv's methods' (``_lru_cache``, 2.1),
    shared by every ShapeEnv: dropping them costs recomputation only."""
    for method in (type(shape_env).get_axioms, type(shape_env)._maybe_evaluate_static):
        method.cache_clear()


def symbol_hints(shape_env: ShapeEnv) -> dict[Any, int]:
    """Each backed symbol's trace-time value (``backed_var_to_val``, 2.13; earlier
    ``var_to_val``)."""
    hints = getattr(shape_env, "backed_var_to_val", None)
    return dict(shape_env.var_to_val if hints is None else hints)


def fake_constant(value: object) -> torch.Tensor | None:
    """The real value a fake tensor carries where its fake mode knows it (``FakeTensor.constant``,
    2.0: a small tensor computed from Python numbers alone, such as ``torch.div(16, 4,
    rounding_mode="trunc")`` in a Dynamo graph); None for any other value."""
    constant = getattr(value, "constant", None) if isinstance(value, FakeTensor) else None
    return constant if isinstance(constant, torch.Tensor) else None


def is_boxed_call(compiled: object) -> bool:
    """Whether AOTAutograd calls ``compiled`` with one list of arguments (``_boxed_call``, 2.0)."""
    return getattr(compiled, "_boxed_call", False)


def make_fx_keeping_detach(
    fn: Callable[..., Any], tracing_mode: Literal["real", "fake"]
) -> Callable[..., torch.fx.GraphModule]:
    """make_fx with ``detach`` kept as ``detach``.

    Graphs fxviews traces run again under autograd (``grad``, ``vjp`` around a transformed
    function), where ``detach`` is a gradient cut. Since torch 2.15 make_fx rewrites ``detach``
    to ``alias`` unless it is given a decomposition table, even an empty one: the graph would
    pass gradients the function stopped.
    """
    return make_fx(fn, decomposition_table={}, tracing_mode=tracing_mode)


def function_apply_attribute() -> Any:
    """``torch.autograd.Function``'s own ``apply`` class attribute, as its ``__dict__`` holds it:
    a Python classmethod before 2.15, ``_FunctionBase``'s C++ classmethod from 2.15 on (where
    apply's Python logic moved). Both bind to a class through ``__get__``; a trace that keeps
    custom Functions as one node puts it back as it was (fxviews/tracing/autograd.py)."""
    return torch.autograd.Function.__dict__["apply"]


def dtensor_op_handlers() -> dict[OpOverload, Any]:
    """DTensor's table of ops it answers in Python before sharding propagation, which
    holds its ``as_strided`` refusal (as of 2.13). Imports torch.distributed.tensor on use."""
    from torch.distributed.tensor import DTensor

    return DTensor._op_dispatcher._custom_op_handlers


class DTensorStrategyTables(NamedTuple):
    """The tables of DTensor's sharding propagator that map an op to how it propagates: its
    strategy function (``op_strategy_funcs``, as of 2.13), the static arguments that key its
    cache (``op_to_schema_info``), the single-dim strategies torch 2.15 consults first
    (``op_single_dim_strategy_funcs``; empty before 2.15), and the argument positions of shapes
    and strides (``op_to_shape_and_stride_idx``). Imports torch.distributed.tensor on use."""

    strategies: dict[Any, Any]
    schema_infos: dict[Any, Any]
    single_dim_strategies: dict[Any, Any]
    shape_and_stride_indices: dict[Any, Any]


def dtensor_strategy_tables() -> DTensorStrategyTables:
    """DTensor's sharding propagator's tables (:class:`DTensorStrategyTables`), live: an entry
    written there is what DTensor uses."""
    from torch.distributed.tensor import DTensor

    propagator = DTensor._op_dispatcher.sharding_propagator
    return DTensorStrategyTables(
        propagator.op_strategy_funcs,
        propagator.op_to_schema_info,
        getattr(propagator, "op_single_dim_strategy_funcs", {}),
        propagator.op_to_shape_and_stride_idx,
    )


def dtensor_spec(x: Any) -> Any:
    """A DTensor's ``DTensorSpec`` (``_spec``, 2.4): its placements and mesh."""
    return x._spec


def dtensor_shards_out_of_order(spec: Any) -> bool:
    """Whether a ``DTensorSpec`` shards a tensor dim over mesh dims in an order other than left
    to right (``shard_order``, from 2.13 on; releases without it have only that order)."""
    order = getattr(spec, "shard_order", None)
    return order is not None and order != type(spec).compute_default_shard_order(spec.placements)


def current_autograd_node() -> Any:
    """The autograd node whose backward is running on this thread, or None
    (``torch._C._current_autograd_node``, 1.13)."""
    return torch._C._current_autograd_node()


# Autocast off on every device for a block, restored after it (an ExcludeDispatchKeyGuard over
# the autocast keys): a graph holding autocast's casts runs under it, as AOTAutograd runs its
# compiled graphs (Note [Modes inside fn]). _DisableAutocast, 1.10.
disable_autocast = torch._C._DisableAutocast
# Whether autocast is on for any device (_is_any_autocast_enabled, 2.4): one C call where
# reading each device's state costs ~1 us.
any_autocast_enabled = torch._C._is_any_autocast_enabled

#: The process settings ops read when they run, besides the default dtype and autocast, by
#: the name a user sets them with, each read by its C getter (the ``torch.backends`` properties
#: cost ~0.5 us a read, and a trace reads them all at every op: Note [Modes inside fn]). The
#: float32 precisions are read per backend and op (_get_fp32_precision_getter, 2.9): the older
#: getters (allow_tf32, float32_matmul_precision) raise where those were set apart.
PROCESS_SETTINGS: dict[str, Callable[[], Any]] = {
    "torch.use_deterministic_algorithms": torch._C._get_deterministic_algorithms,
    "torch.use_deterministic_algorithms(warn_only=)": (
        torch._C._get_deterministic_algorithms_warn_only
    ),
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": (
        torch._C._get_cublas_allow_fp16_reduced_precision_reduction
    ),
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": (
        torch._C._get_cublas_allow_bf16_reduced_precision_reduction
    ),
    "torch.backends.cudnn.enabled": torch._C._get_cudnn_enabled,
    "torch.backends.cudnn.deterministic": torch._C._get_cudnn_deterministic,
    "torch.backends.mkldnn.enabled": torch._C._get_mkldnn_enabled,
    **{
        f"{spelled}.fp32_precision (torch.set_float32_matmul_precision, allow_tf32)": (
            functools.partial(torch._C._get_fp32_precision_getter, backend, op)
        )
        for spelled, backend, op in (
            ("torch.backends", "generic", "all"),
            ("torch.backends.cuda", "cuda", "all"),
            ("torch.backends.cuda.matmul", "cuda", "matmul"),
            ("torch.backends.cudnn.conv", "cuda", "conv"),
            ("torch.backends.cudnn.rnn", "cuda", "rnn"),
            ("torch.backends.mkldnn", "mkldnn", "all"),
            ("torch.backends.mkldnn.matmul", "mkldnn", "matmul"),
            ("torch.backends.mkldnn.conv", "mkldnn", "conv"),
            ("torch.backends.mkldnn.rnn", "mkldnn", "rnn"),
        )
    },
}

# Autograd above the dispatcher, which a trace below it must see (fxviews/tracing/autograd.py).
# The grad-mode switch pre-dispatch IR records as a node (torch._C._set_grad_enabled, 1.x).
set_grad_enabled = torch._C._set_grad_enabled
# A grad-mode region as torch.export's training IR keeps it (a higher-order op around a
# submodule), 2.5.
wrap_with_set_grad_enabled = torch.ops.higher_order.wrap_with_set_grad_enabled
# A custom autograd.Function's backward node class (BackwardCFunction, 1.x) and the Function
# module backward hooks apply to a module's inputs and outputs (BackwardHookFunction, 1.13).
BackwardCFunction = torch.autograd.function.BackwardCFunction
BackwardHookFunction = torch.nn.modules._functions.BackwardHookFunction


def functorch_transforms_active() -> bool:
    """Whether a ``torch.func`` transform is active on this thread
    (``torch._C._are_functorch_transforms_active``, 2.0)."""
    return torch._C._are_functorch_transforms_active()


def top_saved_tensors_hooks() -> Any:
    """The innermost saved-tensor hooks pushed, ``(pack, unpack)``, or None, deferred or not
    (``torch._C._autograd._top_saved_tensors_default_hooks``, 2.0)."""
    return torch._C._autograd._top_saved_tensors_default_hooks(True)


@contextlib.contextmanager
def saved_tensors_hooks_deferred() -> Iterator[None]:
    """Run the block with no saved-tensor hooks called, while their stack stays as it is: the
    flag with which AOTAutograd keeps the caller's hooks off its trace and for the compiled
    graph's run (``torch._C._autograd._saved_tensors_hooks_set_tracing``, pytorch#123196 of
    2024: every release in :data:`SUPPORTED_TORCH` has it). Hooks still push and pop,
    :func:`top_saved_tensors_hooks` still reads the innermost, and
    ``disable_saved_tensors_hooks`` (``torch.func.vjp``, ``vmap``) still refuses a stack that
    holds some, as it does around the eager call."""
    prior = torch._C._autograd._saved_tensors_hooks_set_tracing(True)
    try:
        yield
    finally:
        torch._C._autograd._saved_tensors_hooks_set_tracing(prior)


def mark_as_parameter(tensor: torch.Tensor) -> None:
    """Make ``isinstance(tensor, nn.Parameter)`` true while its class stays a plain tensor's
    (``_ParameterMeta.__instancecheck__`` reads ``_is_param``, 1.9)."""
    tensor._is_param = True  # type: ignore[attr-defined]


#: What a torch function mode sees for ``tensor._is_view()`` (``TensorBase._is_view``, 1.0).
tensor_is_view = torch.Tensor._is_view


def tensor_hooks(tensor: torch.Tensor) -> tuple[Any, ...]:
    """The Python hooks registered on ``tensor``: ``register_hook``'s (``_backward_hooks``, 1.0)
    and ``register_post_accumulate_grad_hook``'s (``_post_accumulate_grad_hooks``, 2.1)."""
    hooks = (tensor._backward_hooks, getattr(tensor, "_post_accumulate_grad_hooks", None))
    return tuple(hook for found in hooks if found for hook in found.values())


def module_backward_hooks(module: torch.nn.Module) -> tuple[Any, ...]:
    """The backward hooks a call of ``module`` installs: its own (``_backward_hooks``,
    ``_backward_pre_hooks``) and the global ones (``_global_backward_hooks``,
    ``_global_backward_pre_hooks`` of ``torch.nn.modules.module``), 2.0."""
    from torch.nn.modules import module as modules

    found = (
        module._backward_hooks,
        module._backward_pre_hooks,
        modules._global_backward_hooks,
        modules._global_backward_pre_hooks,
    )
    return tuple(hook for hooks in found for hook in hooks.values())


def module_hook_dicts(module: torch.nn.Module) -> tuple[dict[int, Any], ...]:
    """The dicts of the hooks a call of ``module`` runs besides ``forward``: its forward,
    forward-pre, backward and backward-pre hooks (``_forward_hooks``, ..., 2.0; the ``with
    kwargs`` and ``always called`` variants are keyed by the same handle ids). Each is keyed by
    its hook's ``RemovableHandle.id``, unique in the process."""
    return (
        module._forward_hooks,
        module._forward_pre_hooks,
        module._backward_hooks,
        module._backward_pre_hooks,
    )


def global_module_hook_dicts() -> tuple[dict[int, Any], ...]:
    """The dicts of the hooks every module call runs (``register_module_forward_hook`` and its
    kin: ``torch.nn.modules.module._global_forward_hooks``, ..., 2.0)."""
    from torch.nn.modules import module as modules

    return (
        modules._global_forward_hooks,
        modules._global_forward_pre_hooks,
        modules._global_backward_hooks,
        modules._global_backward_pre_hooks,
    )


def run_global_forward_pre_hooks_first(picked: Callable[[Any], bool]) -> None:
    """Make the global forward-pre hooks ``picked`` picks the first ones every module call
    runs, each group in its own order (``_global_forward_pre_hooks`` is an ``OrderedDict``,
    run in order, 2.0)."""
    from torch.nn.modules import module as modules

    hooks: Any = modules._global_forward_pre_hooks  # typed as a dict there
    for key in reversed([key for key, hook in hooks.items() if picked(hook)]):
        hooks.move_to_end(key, last=False)


def always_called_forward_hooks(module: torch.nn.Module) -> tuple[dict[int, Any], ...]:
    """The dicts marking the forward hooks registered with ``always_call=True`` on ``module``
    and globally (``_forward_hooks_always_called``, ``_global_forward_hooks_always_called``,
    2.1): ``nn.Module.__call__`` runs those even where the call raises."""
    from torch.nn.modules import module as modules

    return (module._forward_hooks_always_called, modules._global_forward_hooks_always_called)


def dict_version_reader() -> Callable[[dict[Any, Any]], Any]:
    """A reading of a dict's version tag, which CPython moves at every write to the dict
    (PEP 509's ``ma_version_tag``, read by Dynamo's ``dict_version``), where this Python and
    torch give one that does, for a plain dict and for an object's ``__dict__`` alike (checked
    here on probes); elsewhere a reading that never repeats, so a comparison with an earlier
    one always fails and its caller compares the contents instead."""
    try:
        from torch._C._dynamo.guards import dict_version
    except ImportError:  # no Dynamo C extension in this build
        return _never_repeats

    class _Probe:
        pass

    plain: dict[str, int] = {}
    owner = _Probe()
    for target, write in (
        (plain, functools.partial(dict.__setitem__, plain)),
        (owner.__dict__, functools.partial(setattr, owner)),
    ):
        seen = [dict_version(target)]
        for value in (1, 2):
            write("key", value)
            seen.append(dict_version(target))
        del target["key"]
        seen.append(dict_version(target))
        if len(set(seen)) != len(seen) or dict_version(target) != seen[-1]:
            return _never_repeats
    return dict_version


def _never_repeats(held: dict[Any, Any]) -> object:
    return object()


def submodule_dict(module: torch.nn.Module) -> dict[str, Any]:
    """The dict of ``module``'s submodules by name (``nn.Module._modules``, 1.0): where
    ``register_module`` and ``__setattr__`` put them, and ``del m.sub`` deletes them."""
    return module._modules  # type: ignore[return-value]


@contextlib.contextmanager
def rnn_weights_as_held(modules: Sequence[torch.nn.RNNBase]) -> Iterator[None]:
    """Within, each of the recurrent ``modules`` caches the weights it holds now, as
    ``RNNBase._init_flat_weights`` would without flattening them (its ``_flat_weights`` and
    the ``_flat_weight_refs`` its ``forward`` compares them with, 2.1); what it cached before
    is put back after. So a forward run while a trace holds other tensors in its parameter
    slots finds its weights unchanged, and rebinds nothing."""
    rnns = [m for m in modules if "_flat_weight_refs" in vars(m)]
    before = [(m.__dict__["_flat_weights"], m.__dict__["_flat_weight_refs"]) for m in rnns]
    try:
        for module in rnns:
            weights = [getattr(module, name, None) for name in module._flat_weights_names]
            module.__dict__["_flat_weights"] = weights
            module.__dict__["_flat_weight_refs"] = [
                None if w is None else weakref.ref(w) for w in weights
            ]
        yield
    finally:
        for module, (weights, refs) in zip(rnns, before, strict=True):
            module.__dict__["_flat_weights"] = weights
            module.__dict__["_flat_weight_refs"] = refs


def calling_code() -> Iterator[Any]:
    """The code objects of the frames on the stack, from the one iterating this generator
    outwards (``sys._getframe``, CPython)."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        yield frame.f_code
        frame = frame.f_back


def aot_alias_regeneration_modules() -> tuple[Any, ...]:
    """The modules through which AOTAutograd's runtime wrappers call ``gen_alias_from_base``
    (2.13: defined in functional_utils, imported by name into runtime_wrappers), which remakes
    a compiled graph's outputs that alias its inputs with ``base.as_strided(size, stride,
    out.storage_offset())``, or with the view's own function where it has one."""
    from torch._functorch._aot_autograd import functional_utils, runtime_wrappers

    return functional_utils, runtime_wrappers


def wrap_dynamo_tensor_method(name: str, wrap: Callable[[Any], Any]) -> None:
    """Replace the handler with which Dynamo answers a traced tensor's method ``name``
    (``stride``, ``is_contiguous``: from the fake value, at trace time) by ``wrap(handler)``.

    The handler takes ``(variable, tx, *args, **kwargs)``: Dynamo's TensorVariable (its graph
    node is ``variable.proxy.node``) and the instruction translator (``tx.f_code``,
    ``tx.lineno``). From 2.15 it is the ``Method`` entry of ``TensorVariable.tp_methods``;
    before, the method ``TensorVariable.method_<name>`` (2.0-2.14).
    """
    try:
        variable = importlib.import_module("torch._dynamo.variables.tensor").TensorVariable
    except (ImportError, AttributeError) as err:
        raise missing_internal_error("torch._dynamo.variables.tensor.TensorVariable", err) from err
    table = getattr(variable, "tp_methods", None)
    if isinstance(table, dict) and name in table:
        table[name] = type(table[name])(wrap(table[name].handler))
    else:
        setattr(variable, f"method_{name}", wrap(getattr(variable, f"method_{name}")))


@contextlib.contextmanager
def own_tracing_context() -> Iterator[None]:
    """A tracing context of its own for one of several AOTAutograd lowerings under one Dynamo
    graph (``torch._guards.TracingContext`` and ``tracing``, 2.0), sharing the current one's
    fake mode and Dynamo's guards, modules and globals: AOTAutograd keeps the metadata of the
    graph it lowers there (``fw_metadata``), which its lazy backward compile reads back (the
    buffers Inductor may donate); with one context, each lowering would overwrite the last's
    (what DDPOptimizer's own context works around). No current context: nothing to separate.
    """
    from torch._guards import TracingContext, tracing

    current = TracingContext.try_get()
    if current is None:
        yield
        return
    own = TracingContext(current.fake_mode)
    own.guards_context = current.guards_context
    own.module_context = current.module_context
    own.global_context = current.global_context
    with tracing(own):
        yield


def dynamo_signals() -> tuple[type[BaseException], ...]:
    """The exceptions Dynamo itself handles when a backend raises them while compiling: not a
    backend's failure but Dynamo's own control flow, to be let through to it.

    Found from Dynamo's source rather than listed: every exception of Dynamo's own
    (``TorchDynamoException``, 2.0: the restarts of its analysis, ``RestartAnalysis`` and its
    subclasses such as ``TensorifyScalarRestartAnalysis``, which AOTAutograd's scalar pass
    raises to ask for a trace again; ``SkipFrame``; an inner compile's
    ``BackendCompilerFailed``), and the fake-tensor exceptions Dynamo turns into a graph break
    when a backend raises them (``exceptions_allowed_to_be_fallback``, 2.1). On 2.13 these are
    what ``OutputGraph._call_user_compiler`` catches before its catch-all.
    """
    from torch._dynamo import exc

    return (exc.TorchDynamoException, *exc.exceptions_allowed_to_be_fallback)


def frame_entry_settings_hold() -> bool:
    """Whether the process settings are those of the frame Dynamo is compiling when it started
    (grad and autocast modes, the default dtype, deterministic algorithms, matmul precision,
    ...): Dynamo runs the setters of the frame while it traces (``torch.set_default_dtype``),
    and one the frame does not undo is still in force when the backend lowers its graph.
    Dynamo's ``convert_frame.initial_global_state``, a ``GlobalStateGuard`` taken as it starts
    compiling a frame (2.1); True outside a compile."""
    from torch._dynamo import convert_frame

    entry = getattr(convert_frame, "initial_global_state", None)
    return entry is None or bool(entry.check())


def dynamo_functorch_calls() -> dict[str, Any]:
    """The functions Dynamo's graphs call where the user called a ``torch.func`` transform, by
    role: a vmap level's batch dims put on and taken off (``add_batch_dim``,
    ``remove_batch_dim``: ``torch._functorch.predispatch``, 2.5), values passed into or out of a
    grad or jvp level (``wrap_for_grad``, ``unwrap_for_grad``, ``set_tensor_requires_grad``,
    ``make_dual``), a dual's parts (``unpack_dual``) and the gradient step (``autograd_grad``,
    ``torch._functorch.eager_transforms``). As of 2.13.

    Releases before 2.13 (2.11, 2.12) have no ``predispatch`` wrappers for the grad and jvp
    calls: there ``grad`` calls ``torch._C._functorch._unwrap_for_grad`` itself and
    ``torch.autograd.forward_ad`` calls ``torch._VF._make_dual``/``_unpack_dual``, which are
    what Dynamo's graphs then hold."""
    from torch._functorch import eager_transforms, predispatch

    grad_and_dual: tuple[Any, Any, Any]
    if hasattr(predispatch, "_unwrap_for_grad"):
        grad_and_dual = (
            predispatch._unwrap_for_grad,
            predispatch._make_dual,
            predispatch._unpack_dual,
        )
    else:  # 2.11, 2.12
        grad_and_dual = (
            torch._C._functorch._unwrap_for_grad,
            torch._VF._make_dual,
            torch._VF._unpack_dual,
        )
    unwrap_for_grad, make_dual, unpack_dual = grad_and_dual
    return {
        "add_batch_dim": predispatch._add_batch_dim,
        "remove_batch_dim": predispatch._remove_batch_dim,
        "wrap_for_grad": torch._C._functorch._wrap_for_grad,
        "unwrap_for_grad": unwrap_for_grad,
        "set_tensor_requires_grad": eager_transforms._set_tensor_requires_grad,
        "make_dual": make_dual,
        "unpack_dual": unpack_dual,
        "autograd_grad": eager_transforms._autograd_grad,
    }


# Internals resolved on first use, as (module, attribute): importing their modules costs seconds.
_ON_USE: dict[str, tuple[str, str]] = {
    # The torch.compile backend: AOTAutograd lowering as aot_eager does (aot_autograd, 2.0),
    # boxing for compiled graphs and the default partitioner (functorch.compile, 2.0).
    "aot_autograd": ("torch._dynamo.backends.common", "aot_autograd"),
    "make_boxed_func": ("functorch.compile", "make_boxed_func"),
    "min_cut_rematerialization_partition": (
        "functorch.compile",
        "min_cut_rematerialization_partition",
    ),
    # Inductor as the inner compiler: compile_fx's inner_compile hook gets each AOT graph. 2.0.
    "compile_fx": ("torch._inductor.compile_fx", "compile_fx"),
    "compile_fx_inner": ("torch._inductor.compile_fx", "compile_fx_inner"),
    # AOT config patches: the backend turns the AOTAutograd cache off (enable_autograd_cache,
    # 2.4), which would hand back graphs that never went through the engine.
    "functorch_config": ("torch._functorch", "config"),
    # Dynamo's backend registry (register_backend, list_backends, lookup_backend) and a fresh
    # start between compilations (reset), 2.0; its wrapper for backend errors, 2.0.
    "register_backend": ("torch._dynamo", "register_backend"),
    "list_backends": ("torch._dynamo", "list_backends"),
    "lookup_backend": ("torch._dynamo", "lookup_backend"),
    "reset_dynamo": ("torch._dynamo", "reset"),
    "BackendCompilerFailed": ("torch._dynamo.exc", "BackendCompilerFailed"),
    # Whether a symbolic size expression holds for every value its symbols may take (ONNX
    # export's exactness check; statically_known_true, 2.1). Its module loads sympy.
    "statically_known_true": (
        "torch.fx.experimental.symbolic_shapes",
        "statically_known_true",
    ),
    # Proofs over symbolic shapes: bounds of a size expression over its symbols' value ranges
    # (bound_sympy, ValueRanges; 2.1).
    "bound_sympy": ("torch.utils._sympy.value_ranges", "bound_sympy"),
    "ValueRanges": ("torch.utils._sympy.value_ranges", "ValueRanges"),
    # Floor division of sizes as the ShapeEnv writes it (``(s - 3)//2``; FloorDiv, 2.1).
    "FloorDiv": ("torch.utils._sympy.functions", "FloorDiv"),
    # The fake mode of a Dynamo graph's example values (detect_fake_mode, 2.0).
    "detect_fake_mode": ("torch._guards", "detect_fake_mode"),
    # A Dynamo graph split in graph order into parts lowered one by one, as a graph break
    # splits it (split_module, 1.8; keep_original_order, 2.0).
    "split_module": ("torch.fx.passes.split_module", "split_module"),
    # Metadata for graphs that lack it (FakeTensorProp, 2.0).
    "FakeTensorProp": ("torch.fx.passes.fake_tensor_prop", "FakeTensorProp"),
    # The OpInfo database the tests draw view-op samples from (op_db, 1.9).
    "op_db": ("torch.testing._internal.common_methods_invocations", "op_db"),
    # The ModuleInfo database of torch.nn modules and their samples the export tests build
    # (module_db, 1.10).
    "module_db": ("torch.testing._internal.common_modules", "module_db"),
    # DTensor sharding strategies (fxviews.dtensor): what a strategy function returns
    # (OpStrategy of OpSpecs over DTensorSpecs), the cache key of its static arguments
    # (RuntimeSchemaInfo) and the cost of moving an input to a spec; clearing the Python and
    # C++ sharding caches when strategies change (_clear_sharding_prop_cache). All as of 2.13.
    "OpStrategy": ("torch.distributed.tensor._op_schema", "OpStrategy"),
    "OpSpec": ("torch.distributed.tensor._op_schema", "OpSpec"),
    "RuntimeSchemaInfo": ("torch.distributed.tensor._op_schema", "RuntimeSchemaInfo"),
    "DTensorSpec": ("torch.distributed.tensor._dtensor_spec", "DTensorSpec"),
    "generate_redistribute_costs": (
        "torch.distributed.tensor._ops.utils",
        "generate_redistribute_costs",
    ),
    "clear_sharding_prop_cache": ("torch.distributed.tensor.debug", "_clear_sharding_prop_cache"),
}

#: The internals bound at import, then those resolved on first use: every name this module serves.
BOUND_NAMES = (
    "pytree",
    "DataDependentOutputException",
    "DynamicOutputShapeException",
    "FakeTensor",
    "is_fake_device_mismatch",
    "FakeTensorMode",
    "TorchDispatchMode",
    "disable_current_modes",
    "is_impure",
    "make_fx",
    "get_proxy_mode",
    "get_proxy_slot",
    "track_tensor_tree",
    "no_torch_function",
    "disable_proxy_modes_tracing",
    "dispatch_modes",
    "is_functionaltensor",
    "GuardOnDataDependentSymNode",
    "ShapeEnv",
    "PassBase",
    "PassResult",
    "LazyGraphModule",
    "no_dispatch",
    "temporarily_clear_interpreter_stack",
    "is_functorch_wrapped_tensor",
    "get_unwrapped",
    "is_batchedtensor",
    "maybe_get_bdim",
    "functorch_layer_depth",
    "get_inplace_requires_grad_allowed",
    "peek_interpreter_stack",
    "pop_functorch_layers_to",
    "set_inplace_requires_grad_allowed",
    "PreserveDispatchKeyGuard",
    "dispatch_tls_exclude_set",
    "dispatch_tls_include_set",
    "is_fwd_grad_enabled",
    "is_view_replay_enabled",
    "dispatch_mode_depth",
    "function_mode_depth",
    "pop_dispatch_mode",
    "pop_function_mode",
    "set_fwd_grad_enabled",
    "set_view_replay_enabled",
    "has_storage",
    "OpOverload",
    "SchemaArgument",
    "make_contiguous_strides_for",
    "force_original_view_tracking",
    "CompileContext",
    "GlobalStateGuard",
    "TensorGuards",
    "run_outside_dynamo",
    "run_outside_dynamo",
    "has_same_storage_numel",
    "to_copy",
    "efficient_zero_tensor",
    "local_scalar_dense",
    "assert_scalar",
    "unsafe_view",
    "reshape_alias",
    "flash_attention_cpu",
    "flash_attention_cpu_backward",
    "embedding_bag_forward_only",
    "embedding_bag",
    "linalg_det",
    "linalg_slogdet",
    "pdist_forward",
    "pdist_backward",
    "python_dual_level",
    "set_python_dual_level",
    "is_zerotensor",
    "graph_pytree_info",
    "has_plain_codegen",
    "install_graph",
    "op_schema",
    "has_meta_kernel",
    "has_composite_implicit_kernel",
    "storage_identity",
    "is_boxed_call",
    "function_apply_attribute",
    "make_fx_keeping_detach",
    "fake_constant",
    "TORCH_RELEASE",
    "traceable_jacobian_basis",
    "inductor_decompositions",
    "close_abandoned_checkpoints",
    "last_node",
    "symbol_hints",
    "dtensor_op_handlers",
    "DTensorStrategyTables",
    "dtensor_strategy_tables",
    "dtensor_shards_out_of_order",
    "aot_alias_regeneration_modules",
    "dtensor_spec",
    "current_autograd_node",
    "calling_code",
    "set_grad_enabled",
    "disable_autocast",
    "any_autocast_enabled",
    "PROCESS_SETTINGS",
    "frame_entry_settings_hold",
    "wrap_with_set_grad_enabled",
    "BackwardCFunction",
    "BackwardHookFunction",
    "functorch_transforms_active",
    "top_saved_tensors_hooks",
    "saved_tensors_hooks_deferred",
    "mark_as_parameter",
    "tensor_is_view",
    "tensor_hooks",
    "module_backward_hooks",
    "module_hook_dicts",
    "global_module_hook_dicts",
    "run_global_forward_pre_hooks_first",
    "always_called_forward_hooks",
    "dict_version_reader",
    "rnn_weights_as_held",
    "submodule_dict",
    "dynamo_functorch_calls",
    "dynamo_signals",
    "own_tracing_context",
    "wrap_dynamo_tensor_method",
    "forget_static_evaluations",
)
ON_USE_NAMES = tuple(_ON_USE)
__all__ = ["SUPPORTED_TORCH", "missing_internal_error", *BOUND_NAMES, *ON_USE_NAMES]


def __getattr__(name: str) -> Any:
    """Resolve an on-use internal, then keep it as a module attribute."""
    if name not in _ON_USE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, attribute = _ON_USE[name]
    try:
        value = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as err:
        raise missing_internal_error(f"{module_name}.{attribute}", err) from err
    globals()[name] = value
    return value
