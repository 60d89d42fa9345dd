"""What autograd sees is part of the trace: grad-mode regions and custom autograd.Functions are
kept in the graph, and every other autograd-level effect a graph cannot keep is refused.

Note [What autograd sees is part of the trace]
----------------------------------------------
fxviews records the aten ops a function runs *below* autograd (a dispatch mode: the recording,
or make_fx) and runs that graph again *under* the caller's autograd and ``torch.func``
transforms, which differentiate each node as the aten op it is. That equals differentiating
``fn`` only where nothing autograd did above the dispatcher changed which ops it differentiates,
or how. :class:`AutogradWatch` runs inside every trace and keeps or refuses each such thing:

1. **Grad mode is read at every op.** Below every transform, the grad mode an op runs in is
   the one the caller's autograd sees for it: ``no_grad`` / ``set_grad_enabled`` /
   ``enable_grad`` regions and ``@torch.no_grad()`` helpers of ``fn``, the backward pass of an
   ``autograd.grad`` inside ``fn`` (the engine runs it in grad mode ``create_graph``), a
   ``torch.func`` transform inside ``fn`` entered under ``no_grad`` (it sets the mode it was
   entered in on the way down). Where an op's mode differs from the one the graph is in, a
   ``torch._C._set_grad_enabled(mode)`` node goes before it, as PyTorch's pre-dispatch IR keeps
   grad-mode regions, and the graph ends in the call's mode: run, it switches exactly where
   ``fn`` did. (Forward AD ignores grad mode: ``jvp`` was right without it.)
2. **A custom ``autograd.Function`` is kept as itself.** ``apply`` runs C++ code no mode sees
   before the Function's ``forward``, so while a trace runs ``Function.apply`` is replaced (the
   class attribute; a call on another thread, or nested in a kept one, runs as it is) by a
   call that runs it with nothing recorded and adds one node, :class:`KeptFunction`, calling
   ``cls.apply`` on the node's arguments. Run, that node runs the Function's ``forward``,
   ``backward``, ``jvp`` and vmap rule exactly as eager does, or refuses what eager refuses (an
   old-style Function under ``torch.func.grad``). Its ``forward`` still runs under the
   recording's refusals of data dependence (in fake mode, a number or size it computes from
   tensor values is :class:`ValueReadInFunction`: make_fx binds such a number to the node
   that computed it, and here none is recorded), and the memory it makes is the trace's. It is
   kept where it is called outside ``fn``'s own ``torch.func`` transforms (inside one, its rule
   has already run as ops of that transform, which the caller would differentiate instead),
   with plain non-tensor arguments (numbers, strings, dtypes: an object or a callable could
   hold this call's tensors) and tensor (or None) results.
3. **The autograd API that dispatches no op** is seen at the torch-function level, before it
   runs: ``requires_grad_`` (and the ``requires_grad`` setter), a factory's
   ``requires_grad=True`` (set after its op, as ``requires_grad_`` would) and ``detach_``
   (on an argument always: the call's may be a view, which eager refuses to detach in place)
   become nodes doing the same to the graph's tensor when it runs; a ``.data`` read becomes a
   node reading it (:func:`tensor_data`: no aten op shares memory but not the version
   counter); ``torch.autograd.grad`` runs, its
   backward recorded as ops in the grad mode ``create_graph`` gives them, where every
   ``outputs`` and ``inputs`` tensor requires grad in the trace (the trace's own arguments never
   do, so a gradient with respect to an argument is refused rather than baked for the caller's
   ``requires_grad``) and no leaf it reaches has a hook. Hooks (``register_hook``,
   ``register_post_accumulate_grad_hook``, ``retain_grad``: a hook is a Python function of one
   call), ``backward()`` (it accumulates into ``.grad``) and the ``grad`` and ``data`` setters
   are refused. Inside ``fn``'s own ``torch.func`` transforms these are the transform's own
   machinery (``grad`` calls ``requires_grad_`` and ``autograd.grad``): its ops are recorded.
   Reads a graph would bake in stale are refused too: ``.grad`` of a tensor the trace did not
   make (autograd replaces it between calls; of one it made, it is None in eager and in the
   graph), and an argument's ``is_leaf``, ``grad_fn``, ``retains_grad`` (where it requires
   grad), ``is_inference()``, ``_is_view()`` and ``_base``, which the trace's fresh argument
   could answer otherwise than the call's.
4. **The rest is detected by its effect, not its name**, and refused: at every op, a
   forward-grad mode, inference mode or saved-tensor hooks other than the call's (a Function's
   ``forward`` runs with forward grad off, so one whose ``apply`` this module did not see is
   found there; ``torch.utils.checkpoint`` pushes saved-tensor hooks), a backward node other
   than the call's running outside a kept ``autograd.grad``, or a custom Function's backward
   inside one; at every
   module call, backward hooks on the module or global ones; when ``fn`` returns, a grad mode
   it left changed, and a hook, ``retains_grad`` or an unkept custom Function's ``grad_fn`` on
   any tensor the trace made.

A refusal is :class:`NotKept`, naming the construct and the user's line. It stands even where
``fn`` catches it; the tracer turns it into a ``TracingError`` of cause ``"autograd"``, so
``transform`` runs that signature eagerly (``cache_info().eager``), and ``strict=True``,
``trace`` and ``explain`` raise: never a graph whose gradients differ. What was kept is listed
in ``gm.meta["fxviews_autograd"]`` (and in a rewrite's printout).

Example::

    >>> def f(x):
    ...     with torch.no_grad():
    ...         t = x * 2
    ...     return (x * t).sum()
    >>> fxviews.trace(f, torch.ones(3)).meta["fxviews_autograd"]
    ('grad mode off (f.py:2, in f)', 'grad mode on (f.py:4, in f)')
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn, Protocol

import torch
from torch.overrides import TorchFunctionMode

from fxviews.passes.compat.torch_internals import (
    BackwardCFunction,
    BackwardHookFunction,
    TorchDispatchMode,
    always_called_forward_hooks,
    current_autograd_node,
    disable_proxy_modes_tracing,
    function_apply_attribute,
    functorch_transforms_active,
    get_proxy_mode,
    global_module_hook_dicts,
    is_fwd_grad_enabled,
    mark_as_parameter,
    module_backward_hooks,
    module_hook_dicts,
    no_torch_function,
    pytree,
    run_global_forward_pre_hooks_first,
    set_grad_enabled,
    tensor_hooks,
    tensor_is_view,
    top_saved_tensors_hooks,
    track_tensor_tree,
)
from fxviews.passes.schema import AUTOGRAD_KEPT
from fxviews.passes.source_lines import calling_user_line
from fxviews.tracing.modes import (
    AutocastState,
    ModeChange,
    ModeWatch,
    autocast_state,
    under_autocast,
)

__all__ = [
    "AutogradCalls",
    "AutogradWatch",
    "GraphWriter",
    "HOOK",
    "keeping_functions",
    "KeptFunction",
    "ModeNotKept",
    "NestedNotKept",
    "NotKept",
    "PLAIN_VALUES",
    "original_apply",
    "requiring_grad_like",
    "restoring_grad_mode",
    "make_parameter",
    "set_requires_grad",
    "tensor_data",
    "ValueReadInFunction",
]


class NotKept(RuntimeError):
    """An autograd-level construct a graph cannot keep faithfully: trace nothing, run eagerly.

    ``construct`` names it; ``line`` is the user's source line where it was found, if any.
    """

    def __init__(self, construct: str, why: str, line: str | None) -> None:
        where = f" ({line})" if line else ""
        super().__init__(f"{construct}{where}: {why}")
        self.construct = construct
        self.line = line


class HooksNotKept(NotKept):
    """A module call that runs Python hooks besides ``forward`` (Note [The state a graph bakes
    in], item 6): the function runs eagerly while the module has them."""


class ModeNotKept(NotKept):
    """An op run under a mode ``fn`` set, which a graph would run under the caller's (Note
    [Modes inside fn]): the function runs eagerly for this signature."""


class NestedNotKept(NotKept):
    """An op made a nested tensor: a graph of dense strided values does not keep one as eager
    makes it (under ``torch.func`` transforms eager refuses what such a graph would run), so
    the function runs eagerly for this signature."""


class ValueReadInFunction(RuntimeError):
    """The ``forward`` of a custom autograd.Function kept as one node computes a Python number or
    a size from tensor values (``.item()``, ``nonzero``): no graph follows it for every value.

    Its message names the Function (``the forward of custom autograd.Function Normalize``).
    """


class GraphWriter(Protocol):
    """What a tracer lends the watch: its graph, and a way to keep one call as one node."""

    @property
    def graph(self) -> torch.fx.Graph: ...

    def unrecorded(self) -> contextlib.AbstractContextManager[Any]:
        """Ops run in this block are not recorded (their memory is still the trace's)."""
        ...

    def record_call(
        self, target: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], out: Any
    ) -> None:
        """Record ``target(*args, **kwargs)``, which returned ``out``, as one node."""
        ...


class KeptFunction:
    """A node's target that calls a custom ``autograd.Function`` as itself: ``cls.apply``.

    Example::

        >>> KeptFunction(GradientReversal, autocast_state())(x, 0.5)  # GradientReversal.apply
    """

    def __init__(self, cls: type[torch.autograd.Function], autocast: AutocastState) -> None:
        self.cls = cls
        # The autocast state it was called in: its apply reads it (custom_fwd), and the graph
        # runs with autocast off (Note [Modes inside fn], item 1).
        self.autocast = autocast if autocast[0] else None
        self.__name__ = f"{cls.__name__}_apply"  # the node's name, and the code's
        self.__qualname__ = self.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Through the class attribute: traced again (a transformed function inside another's
        # trace), the call is kept again.
        if self.autocast is None:
            return self.cls.apply(*args, **kwargs)
        with under_autocast(self.autocast):
            return self.cls.apply(*args, **kwargs)

    def __repr__(self) -> str:
        return f"{self.cls.__module__}.{self.cls.__qualname__}.apply"


def restoring_grad_mode(forward: Callable[..., Any], graph: torch.fx.Graph) -> Callable[..., Any]:
    """``forward``, putting the caller's grad mode back if it raises inside a grad-mode region
    of ``graph`` (as ``fn``'s ``with torch.no_grad():`` would have); ``forward`` itself where
    ``graph`` switches no grad mode. Free when nothing raises.

    Example::

        >>> run = restoring_grad_mode(gm.forward, gm.graph)
    """
    if not any(node.target is set_grad_enabled for node in graph.nodes):
        return forward

    @functools.wraps(forward)
    def run(*args: Any) -> Any:
        enabled = torch.is_grad_enabled()
        try:
            return forward(*args)
        except BaseException:
            set_grad_enabled(enabled)
            raise

    return run


def requiring_grad_like(fresh: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``fresh`` (a tensor a trace runs ``fn`` on), requiring grad where the call's ``value``
    does, as fn sees it (a ``torch.func.grad`` wrapper does): a Python branch on
    ``requires_grad``, a hook, ``autograd.grad``, a custom Function's ``grad_fn`` then meet in
    the trace what the call gives them. A non-leaf, so ``fn``'s in-place ops on it run (on the
    caller's leaf they raise when the graph runs, as eager's do), and not a view, of
    ``fresh``'s exact sizes, strides and storage offset over a copy of its whole storage: a
    clone would make a sliced sample dense at offset 0, and the trace would read a direct
    call's ``as_strided`` against another layout than the call's (Note [The layout of a call]).
    Where ``value`` is an ``nn.Parameter``, ``isinstance(sample, nn.Parameter)`` is True, as
    ``_ParameterMeta`` answers for a tensor marked ``_is_param`` (the class stays a plain
    tensor's); being one is part of the signature.

    Example::

        >>> x = torch.zeros(4, 6)[1:, 2:5]
        >>> y = requiring_grad_like(x, torch.ones(3, 3, requires_grad=True))
        >>> y.is_leaf, y._is_view(), y.stride(), y.storage_offset()
        (False, False, (6, 1), 8)
    """
    sample = _requiring_grad(fresh, value)
    if type(value) is torch.nn.Parameter:
        mark_as_parameter(sample)
    return sample


def _requiring_grad(fresh: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    if not value.requires_grad or not (fresh.is_floating_point() or fresh.is_complex()):
        return fresh
    elements = fresh.untyped_storage().nbytes() // fresh.element_size()
    whole = torch.empty(0, dtype=fresh.dtype, device=fresh.device)
    whole.set_(fresh.untyped_storage(), 0, (elements,), (1,))
    with torch.enable_grad():
        copy = whole.requires_grad_().clone()
        return copy.as_strided_(fresh.shape, fresh.stride(), fresh.storage_offset())


def _other_state() -> tuple[Any, ...]:
    """The autograd state, other than grad mode, that a graph cannot switch: forward-grad
    mode, inference mode, saved-tensor hooks."""
    return (is_fwd_grad_enabled(), torch.is_inference_mode_enabled(), top_saved_tensors_hooks())


class AutogradWatch:
    """Runs a trace's function, keeping or refusing its autograd structure (see the Note).

    ``writer`` is the recording (:class:`fxviews.tracing.recording.OpRecorder`); None means make_fx,
    whose proxy mode active when :meth:`run` starts is the one written to (a make_fx that
    ``fn`` runs itself, as ``torch.func.linearize`` does, has its own).

    Example::

        >>> watch = AutogradWatch(recorder)
        >>> gm = watch.finish(recorder.graph_module(watch.run(fn, *args)))
    """

    def __init__(self, writer: GraphWriter | None = None, held: int = 0) -> None:
        self.writer: GraphWriter = _MakeFxWriter() if writer is None else writer
        # How many of the last inputs are tensors fn holds (a module's slots: Note [Parameters
        # are read when the graph runs]), not arguments: autograd sees them as it saw the
        # tensors a graph held, whose history is their own.
        self.held = held
        self.call_grad = torch.is_grad_enabled()
        self.grad = self.call_grad  # the grad mode the graph is in, after its last node
        self.others = _other_state()
        self.modes = ModeWatch()  # Note [Modes inside fn]
        # The backward node the call itself runs in (a reentrant checkpoint recomputes its
        # function inside the engine): the caller's, as its grad mode is, not one fn started.
        self.call_node = current_autograd_node()
        self.kept: list[str] = []  # what was kept, for gm.meta and printouts
        self.unrecorded = 0  # depth of kept calls running
        self.backward = 0  # depth of kept autograd.grad calls running
        self.made: list[torch.Tensor] = []  # tensors the trace made, checked when fn returns
        self.user_detach = 0  # depth of fn's own detach() calls running
        # ids of tensors (kept in made) that autograd detached to save them for backward.
        self.saved_detached: set[int] = set()
        self.kept_results: set[int] = set()  # ids of kept Functions' results (kept in made)
        self.refusal: NotKept | ValueReadInFunction | None = None
        self.function = ""  # the name of the kept Function whose forward runs, for refusals
        self.arguments: set[int] = set()  # ids of the tensors fn is called with (kept alive)
        self.argument_nodes: set[Any] = set()  # their autograd nodes, where they have one

    # -- running ----------------------------------------------------------------------------

    def run(self, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)`` with the watch on; raises :class:`NotKept` on a refusal, even one
        ``call`` caught."""
        if isinstance(self.writer, _MakeFxWriter):
            self.writer.bind(get_proxy_mode())
        passed = args[: len(args) - self.held]
        tensors = [t for t in pytree.tree_leaves(passed) if isinstance(t, torch.Tensor)]
        self.arguments = {id(t) for t in tensors}
        self.argument_nodes = {t.grad_fn for t in tensors if t.grad_fn is not None}
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(keeping_functions(self))
                stack.enter_context(_ModuleHooks(self))
                stack.enter_context(AutogradCalls(self))
                stack.enter_context(_AutogradOps(self))
                out = call(*args)
                if torch.is_grad_enabled() != self.call_grad:
                    self.refuse("torch.set_grad_enabled", "fn returns with grad mode changed")
                change = self.modes.at_return()
                if change is not None:
                    self.refuse_mode(change)
            self._check_made()
        except Exception as err:
            # A refusal stands whatever fn made of it (caught it, raised another error).
            if self.refusal is not None and err is not self.refusal:
                raise self.refusal from err
            raise
        if self.refusal is not None:
            raise self.refusal
        return out

    def wrap(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """``call`` run by :meth:`run` (for tracers that call the function themselves)."""

        @functools.wraps(call)
        def watched(*args: Any) -> Any:
            return self.run(call, *args)

        return watched

    def finish(self, gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        """``gm``, ending in the call's grad mode, with what was kept in its meta."""
        if self.grad != self.call_grad:
            with gm.graph.inserting_before(gm.graph.output_node()):
                gm.graph.call_function(set_grad_enabled, (self.call_grad,))
            gm.recompile()
        if self.kept:
            gm.meta[AUTOGRAD_KEPT] = tuple(self.kept)
        return gm

    def refuse(self, construct: str, why: str) -> NoReturn:
        """Raise (and remember) a :class:`NotKept` at the user's current line."""
        if self.refusal is None:
            self.refusal = NotKept(construct, why, calling_user_line())
        raise self.refusal

    def refuse_hooks(self, construct: str) -> NoReturn:
        """Raise (and remember) a :class:`HooksNotKept` for ``construct``."""
        if self.refusal is None:
            self.refusal = HooksNotKept(construct, HOOK, calling_user_line())
        raise self.refusal

    def refuse_mode(self, change: ModeChange) -> NoReturn:
        """Raise (and remember) a :class:`ModeNotKept` for ``change``."""
        if self.refusal is None:
            self.refusal = ModeNotKept(change.construct, change.why, calling_user_line())
        raise self.refusal

    def refuse_value_read(self) -> NoReturn:
        """Raise (and remember) a :class:`ValueReadInFunction`: the op running now, in a kept
        Function's ``forward``, computed a number or a size from tensor values."""
        if self.refusal is None:
            self.refusal = ValueReadInFunction(f"the forward of {self.function}")
        raise self.refusal

    # -- what the modes report ----------------------------------------------------------------

    def before_op(self, func: Any, args: Sequence[Any]) -> None:
        """Step 1 and the per-op effects of step 4, before ``func(*args)`` runs."""
        grad = torch.is_grad_enabled()
        if grad != self.grad:
            self.writer.graph.call_function(set_grad_enabled, (grad,))
            self.grad = grad
            self.note(f"grad mode {'on' if grad else 'off'}")
        others = _other_state()
        if others != self.others:
            self._refuse_state(func, others)
        change = self.modes.before_op(func)
        if change is not None:
            self.refuse_mode(change)
        node = current_autograd_node()
        if node is None or node is self.call_node:
            return
        if not self.backward:
            self.refuse(
                f"a backward pass ({type(node).__name__})",
                "autograd runs it outside torch.autograd.grad (backward(), or the engine called "
                "directly): its effects on .grad and hooks are not ops a graph can keep",
            )
        if isinstance(node, BackwardCFunction):
            self.refuse(
                f"the backward of a custom autograd.Function ({type(node).__name__})",
                "it runs inside fn (torch.autograd.grad); a graph would differentiate its ops, "
                "where autograd applies the Function's own rules (or refuses, once_differentiable)",
            )
        if grad and any(id(t) in self.saved_detached for t in pytree.tree_leaves(args)):
            self.refuse(
                f"torch.autograd.grad(create_graph=True) ({type(node).__name__})",
                "its backward reads an output autograd saved, which a trace records detached "
                "(a Python dispatch key detaches what autograd saves): differentiating the graph "
                "would stop there, where autograd differentiates through it",
            )

    def _refuse_state(self, func: Any, others: tuple[Any, ...]) -> NoReturn:
        fwd_grad, inference, hooks = others
        if inference != self.others[1]:
            self.refuse(
                "torch.inference_mode()",
                "inference tensors behave differently under autograd from the graph's tensors",
            )
        if fwd_grad != self.others[0]:
            self.refuse(
                f"{func} with forward AD {'on' if fwd_grad else 'off'}",
                "ops run with the forward-grad mode changed, as in the forward of a custom "
                "autograd.Function whose apply fxviews did not see (one that overrides apply?)",
            )
        pack = hooks[0] if hooks else None
        self.refuse(
            f"saved-tensor hooks ({getattr(pack, '__module__', '')}."
            f"{getattr(pack, '__qualname__', pack)})",
            "autograd.graph.saved_tensors_hooks (torch.utils.checkpoint uses them) change what "
            "backward computes from; a graph saves what autograd saves for its own ops",
        )

    def made_by_op(self, func: Any, args: Sequence[Any], kwargs: dict[str, Any], out: Any) -> None:
        """Remember the tensors an op made, for the check when ``fn`` returns, and those
        autograd detached to save them: a ``detach`` no ``detach()`` of ``fn`` asked for, of
        a tensor that requires grad (one that does not has no gradient to stop). Refuses an
        op whose result the default dtype decided, where ``fn`` changed it (Note [Modes inside
        fn])."""
        change = self.modes.after_op(func, args, kwargs, out)
        if change is not None:
            self.refuse_mode(change)
        if any(t.is_nested for t in _tensors(out)) and self.refusal is None:
            self.refusal = NestedNotKept(
                f"{func}, which makes a nested tensor", _NESTED, calling_user_line()
            )
            raise self.refusal
        if isinstance(out, torch.Tensor):
            self.made.append(out)
            if func is _DETACH and not self.user_detach and args[0].requires_grad:
                self.saved_detached.add(id(out))
        elif isinstance(out, (tuple, list)):
            self.made += [t for t in out if isinstance(t, torch.Tensor)]

    def _check_made(self) -> None:
        """Step 4 when ``fn`` returns: hooks and unkept custom Functions on what it made."""
        with no_torch_function():  # plain attribute reads, no mode in between
            for tensor in self.made:
                if tensor_hooks(tensor) or tensor.retains_grad:
                    self.refuse(
                        "a hook on a tensor fn computes",
                        "hooks are Python functions of one call, which a graph cannot keep",
                    )
                grad_fn = tensor.grad_fn
                if isinstance(grad_fn, BackwardCFunction) and id(tensor) not in self.kept_results:
                    self.refuse(
                        f"a custom autograd.Function ({type(grad_fn).__name__})",
                        "a result of it was made by an apply fxviews did not see",
                    )

    def made_by_trace(self, tensor: torch.Tensor) -> bool:
        """Whether an op (or a kept Function) of this trace made ``tensor``."""
        return any(made is tensor for made in self.made)

    def note(self, what: str) -> None:
        """Say that ``what`` was kept, at the user's current line."""
        line = calling_user_line()
        self.kept.append(f"{what} ({line})" if line else what)

    # -- what is kept as one node ---------------------------------------------------------------

    def keep_function(
        self, cls: type[torch.autograd.Function], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Step 2: ``cls.apply(*args, **kwargs)``, recorded as one node."""
        name = f"custom autograd.Function {cls.__qualname__}"
        if cls is BackwardHookFunction:
            self.refuse("a module backward hook", "hooks are Python functions of one call")
        if functorch_transforms_active():
            self.refuse(
                name,
                "it is applied inside a torch.func transform inside fn (or under transform's "
                "functionalize=True), whose result holds the Function's rule as ops: the caller "
                "would differentiate those instead",
            )
        for leaf in pytree.tree_leaves((args, kwargs)):
            if not isinstance(leaf, torch.Tensor) and not isinstance(leaf, PLAIN_VALUES):
                self.refuse(
                    name,
                    f"it is passed a {type(leaf).__name__}, which could hold this call's "
                    f"tensors; a graph keeps numbers, strings, dtypes and tensors",
                )
        self.function = name
        with self.writer.unrecorded(), self.deeper("unrecorded"):
            out = original_apply(cls, *args, **kwargs)
        results = out if isinstance(out, tuple) else (out,)
        if any(r is not None and not isinstance(r, torch.Tensor) for r in results):
            self.refuse(name, "it returns a value other than tensors, which would be baked in")
        self.writer.record_call(KeptFunction(cls, autocast_state()), args, kwargs, out)
        tensors = [r for r in results if isinstance(r, torch.Tensor)]
        self.made += tensors
        self.kept_results.update(map(id, tensors))
        self.note(f"{name} kept as one node")
        return out

    def keep_data_read(self, tensor: torch.Tensor, read: Callable[[torch.Tensor], Any]) -> Any:
        """Step 3: ``read(tensor)``, ``tensor.data``, recorded as one :func:`tensor_data` node
        standing for its result, outside ``fn``'s own transforms (there, their own rule)."""
        if self.unrecorded or functorch_transforms_active():
            return read(tensor)
        with self.writer.unrecorded(), self.deeper("unrecorded"):  # make_fx's is a detach
            out = read(tensor)
        self.writer.record_call(tensor_data, (tensor,), {}, out)
        self.made.append(out)
        return out

    def keep_tensor_call(
        self, target: Callable[..., Any], tensor: torch.Tensor, *args: Any
    ) -> None:
        """Step 3: ``target(tensor, *args)`` (already run) recorded as one node standing for
        ``tensor`` from now on, outside ``fn``'s own transforms."""
        if not (self.unrecorded or functorch_transforms_active()):
            self.writer.record_call(target, (tensor, *args), {}, tensor)

    @contextlib.contextmanager
    def deeper(self, counter: str) -> Iterator[None]:
        """One more level of ``counter`` (``unrecorded``: a kept call runs; ``backward``: a kept
        ``autograd.grad`` runs; ``user_detach``: ``fn``'s own ``detach()`` runs) in the block."""
        setattr(self, counter, getattr(self, counter) + 1)
        try:
            yield
        finally:
            setattr(self, counter, getattr(self, counter) - 1)


#: Non-tensor arguments a kept Function's node may hold: values, never containers of state.
PLAIN_VALUES = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
    slice,
    type(Ellipsis),
)


class _MakeFxWriter:
    """:class:`GraphWriter` of a make_fx trace, through its proxy mode."""

    tracer: Any = None

    def bind(self, mode: Any) -> None:
        """Write to ``mode``'s graph: the proxy mode of the make_fx running the function."""
        if mode is None:
            raise RuntimeError("fxviews: AutogradWatch(None) runs only inside make_fx")
        self.tracer = mode.tracer

    @property
    def graph(self) -> torch.fx.Graph:
        return self.tracer.graph

    def unrecorded(self) -> contextlib.AbstractContextManager[Any]:
        return disable_proxy_modes_tracing()

    def record_call(
        self, target: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], out: Any
    ) -> None:
        tracer = self.tracer
        proxy_args = pytree.tree_map(tracer.unwrap_proxy, tuple(args))
        proxy_kwargs = pytree.tree_map(tracer.unwrap_proxy, kwargs)
        proxy = tracer.create_proxy("call_function", target, proxy_args, proxy_kwargs)
        track_tensor_tree(out, proxy, constant=None, tracer=tracer)


class _AutogradOps(TorchDispatchMode):
    """Below autograd, at every op: step 1, and the per-op effects of step 4."""

    def __init__(self, watch: AutogradWatch) -> None:
        super().__init__()
        self.watch = watch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        watch = self.watch
        if watch.unrecorded:
            out = func(*args, **(kwargs or {}))
            if _holds_traced_numbers(out):
                watch.refuse_value_read()
            return out
        kwargs = kwargs or {}
        watch.before_op(func, args)
        out = func(*args, **kwargs)
        watch.made_by_op(func, args, kwargs, out)
        return out


def _holds_traced_numbers(out: Any) -> bool:
    """Whether an op's result holds a symbolic number, or a tensor of a symbolic size.

    Traces run on static shapes, so in fake mode such a number stands for tensor values
    (``.item()``, ``nonzero``). make_fx binds it to the node it records for the op; inside a
    kept call, where nothing is recorded, it would stay bound to nothing (PyTorch's
    ``PendingUnbackedSymbolNotFound`` at the next recorded op).
    """
    for leaf in pytree.tree_leaves(out):
        if isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(leaf, torch.Tensor) and any(isinstance(n, torch.SymInt) for n in leaf.shape):
            return True
    return False


_DETACH = torch.ops.aten.detach.default

_NESTED = (
    "a trace runs on dense strided tensors, and a graph of them does not keep a nested tensor "
    "as eager makes it"
)


def _tensors(out: Any) -> list[torch.Tensor]:
    """The tensors among an op's results (a tensor, or a tuple or list of them)."""
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for t in out if isinstance(t, torch.Tensor)] if isinstance(out, (tuple, list)) else []


class _ModuleHooks:
    """At every module call on the tracing thread, outside kept calls: step 4's module hooks.

    A refused trace runs ``fn`` again eagerly, so no hook of the user's may run before the
    refusal: the check is a global forward-pre hook run, with fxviews' own (:class:`ModuleCalls`
    records the module first), before the user's global ones registered earlier; and the marks
    of the forward hooks registered with ``always_call=True``, which ``nn.Module.__call__``
    runs as the refusal leaves the call, are taken off until the trace is over (for the global
    ones process-wide: a module call of another thread raising in those microseconds would
    not run them).
    """

    def __init__(self, watch: AutogradWatch) -> None:
        self.watch = watch
        self.thread = threading.get_ident()
        self.handle: Any = None
        self.held_back: list[tuple[dict[int, Any], dict[int, Any]]] = []

    def __enter__(self) -> None:
        self.handle = torch.nn.modules.module.register_module_forward_pre_hook(self.check)
        run_global_forward_pre_hooks_first(_fxviews_own)

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()
        for marks, held in self.held_back:
            marks.update(held)
        self.held_back.clear()

    def check(self, module: torch.nn.Module, args: Any) -> None:
        if threading.get_ident() != self.thread or self.watch.unrecorded:
            return
        backward = module_backward_hooks(module)
        forward = [
            hook
            for hooks in (*module_hook_dicts(module)[:2], *global_module_hook_dicts()[:2])
            for hook in hooks.values()
            if not _fxviews_own(hook)
        ]
        if not backward and not forward:
            return
        for marks in always_called_forward_hooks(module):
            if marks:
                self.held_back.append((marks, dict(marks)))
                marks.clear()
        if backward:
            self.watch.refuse(
                f"backward hooks on {type(module).__name__} (register_full_backward_hook)",
                HOOK,
            )
        raise self.watch.refuse_hooks(
            f"forward hooks on {type(module).__name__} ({_hook_names(forward)})"
        )


# --- step 2: Function.apply while a trace runs ---------------------------------------------

# The class attribute, put back as it was (a classmethod_descriptor from torch 2.15 on).
_ORIGINAL_APPLY: Any = function_apply_attribute()


def original_apply(cls: type[torch.autograd.Function], *args: Any, **kwargs: Any) -> Any:
    """``cls.apply(*args, **kwargs)`` as PyTorch defines it, whatever the class holds now."""
    return _ORIGINAL_APPLY.__get__(None, cls)(*args, **kwargs)


_tracing = threading.local()  # .watch: the watch of the trace running on this thread
_patch_lock = threading.Lock()
_patches = [0]  # traces running with the replacement installed, on any thread


def _apply_while_tracing(cls: type[torch.autograd.Function], *args: Any, **kwargs: Any) -> Any:
    watch = getattr(_tracing, "watch", None)
    if watch is None or watch.unrecorded:  # another thread, or nested in a kept call
        return original_apply(cls, *args, **kwargs)
    return watch.keep_function(cls, args, kwargs)


@contextlib.contextmanager
def keeping_functions(watch: AutogradWatch) -> Iterator[None]:
    """``Function.apply`` kept as one node for ``watch``'s trace, on this thread."""
    previous = getattr(_tracing, "watch", None)
    _tracing.watch = watch
    with _patch_lock:
        if not _patches[0]:
            torch.autograd.Function.apply = classmethod(_apply_while_tracing)  # type: ignore[assignment, method-assign]
        _patches[0] += 1
    try:
        yield
    finally:
        with _patch_lock:
            _patches[0] -= 1
            if not _patches[0]:
                torch.autograd.Function.apply = _ORIGINAL_APPLY  # type: ignore[method-assign]
        _tracing.watch = previous


# --- step 3: the autograd API that dispatches no op ----------------------------------------


def set_requires_grad(tensor: torch.Tensor, requires_grad: bool = True) -> torch.Tensor:
    """``tensor.requires_grad_(requires_grad)``: a node doing what ``fn`` did to that tensor.

    Example::

        >>> set_requires_grad(torch.zeros(2)).requires_grad
        True
    """
    return tensor.requires_grad_(requires_grad)


def make_parameter(tensor: torch.Tensor, requires_grad: bool = True) -> torch.Tensor:
    """``nn.Parameter(tensor, requires_grad)``: a node making the Parameter ``fn`` made.

    Example::

        >>> type(make_parameter(torch.zeros(2)))
        <class 'torch.nn.parameter.Parameter'>
    """
    return torch.nn.Parameter(tensor, requires_grad)


def tensor_data(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor.data``: a node reading it from the graph's tensor when the graph runs.

    No aten op is ``.data``: it shares ``tensor``'s memory with a version counter of its own
    and no autograd history, where ``detach`` (make_fx's record of it) and ``alias`` share the
    version counter, so a write through the graph's would fail the backward of an op that
    saved ``tensor``, and eager's does not. Under the caller's ``vmap`` it raises as eager's.

    Example::

        >>> w = torch.ones(2, requires_grad=True)
        >>> tensor_data(w).mul_(2)._version, w._version, tensor_data(w).requires_grad
        (1, 0, False)
    """
    return tensor.data


_GRAD_SIGNATURE = inspect.signature(torch.autograd.grad)


def _as_tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _backward_nodes(outputs: Sequence[torch.Tensor], stops: Sequence[Any] = ()) -> Iterator[Any]:
    """The autograd nodes a backward pass from ``outputs`` reaches, going no further than the
    nodes in ``stops`` (which are reached)."""
    seen: set[Any] = set()
    pending: list[Any] = [t.grad_fn for t in outputs]
    while pending:
        node = pending.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        yield node
        if node not in stops:
            pending += [next_node for next_node, _ in node.next_functions]


def _hooked_leaves(outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The leaf tensors with hooks that a backward pass from ``outputs`` reaches."""
    # An AccumulateGrad node holds its leaf as its variable.
    leaves = (getattr(node, "variable", None) for node in _backward_nodes(outputs))
    return [t for t in leaves if isinstance(t, torch.Tensor) and tensor_hooks(t)]


def _reaches_an_argument(
    watch: AutogradWatch, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]
) -> bool:
    """Whether the gradients of ``outputs`` with respect to ``inputs`` reach one of ``fn``'s
    arguments that requires grad: the trace's stand-in for it starts a history of its own,
    where eager's gradient goes on into the caller's (the hooks registered on the argument,
    the tensors it was computed from, such as a parameter ``inputs`` names)."""
    stops = [t.grad_fn for t in inputs if t.grad_fn is not None]
    return any(node in watch.argument_nodes for node in _backward_nodes(outputs, stops))


def _autograd_grad(watch: AutogradWatch, func: Any, args: Any, kwargs: Any) -> Any:
    if not functorch_transforms_active():  # fn's own call, not a transform's machinery
        bound = _GRAD_SIGNATURE.bind(*args, **kwargs)
        outputs = _as_tuple(bound.arguments["outputs"])
        inputs = _as_tuple(bound.arguments["inputs"])
        for tensor in outputs + inputs:
            if not isinstance(tensor, torch.Tensor) or not tensor.requires_grad:
                watch.refuse(
                    "torch.autograd.grad",
                    "one of its outputs or inputs does not require grad while traced (fxviews "
                    "traces on arguments that do not, whatever the caller's do)",
                )
        if _hooked_leaves(outputs):
            watch.refuse("torch.autograd.grad", "it reaches a tensor with hooks")
        if _reaches_an_argument(watch, outputs, inputs):
            watch.refuse(
                "torch.autograd.grad",
                "its gradient reaches an argument of fn, and goes on in eager into the caller's "
                "autograd graph (hooks on the argument, the tensors it was computed from), "
                "which the trace's fresh argument does not have",
            )
        watch.note("torch.autograd.grad: its backward pass kept as ops")
    with watch.deeper("backward"):
        return func(*args, **kwargs)


# Kept only where they change the trace's tensor: its requires_grad is the call's (the trace's
# arguments require grad where the call's do), so a no-op here is one there (nn.Parameter's
# `data.detach().requires_grad_(False)`), and is left out as eager's would do nothing.


def _requires_grad_(watch: AutogradWatch, func: Any, args: Any, kwargs: Any) -> Any:
    tensor = args[0]
    before = tensor.requires_grad
    try:
        out = func(*args, **kwargs)
    except RuntimeError:
        if functorch_transforms_active():  # refused for good: no later call can trace it
            watch.refuse("Tensor.requires_grad_", "torch.func transforms refuse it (as eager's "
                         "do; transform's functionalize=True is one)")  # fmt: skip
        raise
    if _called_by(_PARAMETER_NEW):
        # nn.Parameter(t) of a fake (or subclass) tensor: t.detach().requires_grad_(r), of a
        # real one a Parameter (_make_subclass, which vmap takes): kept as the call it was.
        watch.keep_tensor_call(make_parameter, tensor, tensor.requires_grad)
    elif tensor.requires_grad != before:
        watch.keep_tensor_call(set_requires_grad, tensor, tensor.requires_grad)
    return out


_PARAMETER_NEW = torch.nn.Parameter.__new__.__code__


def _called_by(code: types.CodeType, depth: int = 6) -> bool:
    """Whether a frame of ``code`` is among the ``depth`` frames above this one's caller."""
    here = inspect.currentframe()
    frame = here.f_back.f_back if here is not None and here.f_back is not None else None
    for _ in range(depth):
        if frame is None:
            return False
        if frame.f_code is code:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _detach_(watch: AutogradWatch, func: Any, args: Any, kwargs: Any) -> Any:
    # Kept on every argument too: its sample is never a view, where the call's may be, and
    # eager refuses to detach a view in place; the node refuses it on each call's tensor.
    kept = args[0].requires_grad or id(args[0]) in watch.arguments
    out = func(*args, **kwargs)
    if kept:
        watch.keep_tensor_call(torch.ops.aten.detach_.default, args[0])
    return out


def _detach(watch: AutogradWatch, func: Any, args: Any, kwargs: Any) -> Any:
    with watch.deeper("user_detach"):
        return func(*args, **kwargs)


def _data_read(watch: AutogradWatch, func: Any, args: Any, kwargs: Any) -> Any:
    return watch.keep_data_read(args[0], func)


def _made_requiring_grad(watch: AutogradWatch, func: Any, args: Any, kwargs: Any) -> Any:
    """A factory given ``requires_grad=True`` (``torch.zeros``, ``torch.tensor``,
    ``x.new_ones``): PyTorch sets it on the result after the op, as ``requires_grad_`` would,
    so it is kept as that is: the graph's result is the leaf requiring grad eager's is."""
    out = func(*args, **kwargs)
    if isinstance(out, torch.Tensor) and out.requires_grad and out.is_leaf:
        watch.keep_tensor_call(set_requires_grad, out, True)
    return out


def _grad_read(watch: AutogradWatch, func: Any, args: Any, kwargs: Any) -> Any:
    # Of a tensor the trace made, .grad is None in eager and when the graph runs (backward,
    # retain_grad and the setter are refused); of any other, it is autograd's state between
    # calls (zero_grad sets it to None, backward makes a new one), which a graph would bake in.
    if not watch.made_by_trace(args[0]):
        watch.refuse("reading Tensor.grad of a tensor fn did not make", _GRAD_READ)
    return func(*args, **kwargs)


def _argument_read(name: str, history: bool) -> Callable[..., Any]:
    """The handler of a read of ``name`` that refuses it on one of ``fn``'s arguments where the
    trace's could answer otherwise than the call's: for autograd ``history`` (``is_leaf``,
    ``grad_fn``, ``retains_grad``) where it requires grad (the trace's is then a non-leaf copy;
    one that does not is a leaf in both); for the others (``is_inference()``, ``_is_view()``,
    ``_base``) always, as the signature does not hold them."""

    def read(watch: AutogradWatch, func: Any, args: Any, kwargs: Any) -> Any:
        tensor = args[0]
        if id(tensor) in watch.arguments and (tensor.requires_grad or not history):
            watch.refuse(f"reading Tensor.{name} of an argument", _ARGUMENT_READ)
        return func(*args, **kwargs)

    return read


def _refused(construct: str, why: str) -> Callable[..., Any]:
    def refuse(watch: AutogradWatch, func: Any, args: Any, kwargs: Any) -> Any:
        watch.refuse(construct, why)

    return refuse


def _setter(name: str) -> Any:
    """What a torch function mode sees for an assignment to the tensor attribute ``name``."""
    return getattr(torch.Tensor, name).__set__


def _getter(name: str) -> Any:
    """What a torch function mode sees for a read of the tensor attribute ``name``."""
    return getattr(torch.Tensor, name).__get__


HOOK = "hooks are Python functions of one call, which a graph cannot keep"
_BACKWARD = "it accumulates gradients into .grad, which a graph cannot keep"
_GRAD_READ = (
    "autograd replaces .grad between calls (zero_grad sets it to None, backward makes a new "
    "one), where a graph would keep reading this call's"
)
_ARGUMENT_READ = (
    "the trace runs fn on a fresh tensor in its place, whose answer the call's may not share "
    "(only requires_grad is part of the signature)"
)

#: Step 3's handlers, by the function a torch function mode sees.
_HANDLERS: dict[Any, Callable[..., Any]] = {
    torch.autograd.grad: _autograd_grad,
    torch.Tensor.requires_grad_: _requires_grad_,
    _setter("requires_grad"): _requires_grad_,
    torch.Tensor.detach_: _detach_,
    torch.Tensor.detach: _detach,
    torch.detach: _detach,
    torch.Tensor.backward: _refused("Tensor.backward()", _BACKWARD),
    torch.autograd.backward: _refused("torch.autograd.backward", _BACKWARD),
    torch.Tensor.register_hook: _refused("Tensor.register_hook", HOOK),
    torch.Tensor.register_post_accumulate_grad_hook: _refused(
        "Tensor.register_post_accumulate_grad_hook", HOOK
    ),
    torch.Tensor.retain_grad: _refused("Tensor.retain_grad", HOOK),
    _setter("grad"): _refused("setting Tensor.grad", "a graph cannot keep an assignment to .grad"),
    _getter("grad"): _grad_read,
    _getter("is_leaf"): _argument_read("is_leaf", history=True),
    _getter("grad_fn"): _argument_read("grad_fn", history=True),
    _getter("retains_grad"): _argument_read("retains_grad", history=True),
    torch.Tensor.is_inference: _argument_read("is_inference()", history=False),
    tensor_is_view: _argument_read("_is_view()", history=False),
    _getter("_base"): _argument_read("_base", history=False),
    _getter("data"): _data_read,
    _setter("data"): _refused(
        "setting Tensor.data", "it swaps a tensor's memory behind autograd, out of any graph"
    ),
}


class AutogradCalls(TorchFunctionMode):
    """Above autograd, at every torch function: step 3."""

    def __init__(self, watch: AutogradWatch) -> None:
        super().__init__()
        self.watch = watch

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        handler = _HANDLERS.get(func)
        if handler is None:
            if not kwargs.get("requires_grad"):
                return func(*args, **kwargs)
            handler = _made_requiring_grad
        return handler(self.watch, func, args, kwargs)


def _fxviews_own(hook: Any) -> bool:
    """Whether ``hook`` is one of fxviews' own global hooks, registered while it traces."""
    return (getattr(hook, "__module__", None) or "").split(".")[0] == "fxviews"


def _hook_names(hooks: list[Any]) -> str:
    """The hooks' names, for a refusal: ``record, log_shapes``."""
    return ", ".join(getattr(hook, "__qualname__", None) or repr(hook) for hook in hooks)
