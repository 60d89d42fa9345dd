"""Layout truth: check the traced layouts the engine proves against on eager kernels.

Note [Layouts are facts to check]
---------------------------------
The engine proves each rewrite relative to the layout of the as_strided's input recorded in
its ``meta["val"]``. In a graph traced in fake mode (make_fx, Dynamo, AOTAutograd, export,
FakeTensorProp) that layout is what the op's fake or meta kernel computed, and where it differs
from the op's eager kernel (``roll`` of a channels_last tensor: fake says contiguous, eager
keeps channels_last), a chain proven against it reads other memory than the eager program's
``as_strided`` does: a "verified" rewrite that is wrong. So the recorded layouts are checked
against the layouts eager PyTorch produces, the way PyTorch's ``CrossRefFakeMode`` checks
fake strides against real ones:

1. **What is trusted.** A graph input's recorded layout is the caller's (Dynamo guards it; a
   make_fx or export example gives it). A graph whose every value was produced by real kernels
   (``transform``'s recording, ``graph_module.meta[REAL_LAYOUTS]``) is trusted whole and not
   checked. A caller may say more of a node (``meta[LAYOUT_FACT]``): that its layout is a fact
   like an input's (the compile backend's per-sample values under vmap, which it defines), that
   it is another node's (a wrapper of that node's tensor), or that it cannot be vouched for.
2. **Eager layouts, node by node.** For every node an as_strided-family node reads, through
   any op back to the graph inputs, the eager layout is computed in graph order: the node's
   eager kernel runs on fresh zero tensors with the *eager* layouts of its tensor arguments
   (their traced dtypes, devices and storage sizes; symbolic sizes at their trace-time
   values), and its result's layout is read. The device is the traced one, since a kernel's
   layout may differ between devices (CUDA's from CPU's). The meta device has no eager
   kernels (its kernels are the fake ones, the very layouts under check), and a graph traced
   there is run elsewhere: its kernels' layouts are left unchecked. A node whose eager
   layout equals its recorded one (:func:`~.geometry.equivalent`) agrees; one that differs
   while its arguments agree is the *origin* of the disagreement; a difference its consumer
   absorbs (a ``clone`` to contiguous) stops there. A view op of inputs that agree is not
   run: view kernels compute their layouts with one implementation for meta and eager
   tensors (the engine's own chain verification on meta tensors stands on the same fact), and
   the sweep in ``tests/test_layout_truth.py`` finds no view op that disagrees.
3. **Once per (op, geometry).** Each run is cached process-wide under the op and its
   arguments' layouts and values, so a graph pays once per distinct call, and a retrace or
   another graph with the same calls pays nothing. Random ops run with the random state
   restored afterwards.
4. **The verdict.** An as_strided-family node whose input's recorded layout (for the
   copying variants, or its own) is not eager's is kept, with a reason naming the op whose
   traced layout disagrees and both layouts; its ``meta[LAYOUT_DOUBT]`` says so to later
   steps (pinning must not force the traced layout on its memory). A scatter's ``src`` is
   read by its logical values, so its layout is not a fact the proof uses. Where the eager
   layout cannot be computed (an op that is not aten's, prims' or a torch function, a
   higher-order op, a kernel that fails on zeros, an argument on the meta device or on one
   this process cannot reach) the node is kept too, saying why: a layout that could not be
   checked is not proven. A failure that leaves the device unusable is not such an answer:
   it raises (Note [A device error is fatal] in ``device_faults``).

Only the layouts are compared (sizes, strides of dims of size > 1, storage offset), never
values. With symbolic shapes the check runs at the trace-time sizes (the symbols' hints): a
kernel whose eager layout departs from its fake one only at other sizes is not seen.

Cost: nothing for recorded graphs and for as_strided nodes over graph inputs; otherwise one
eager run per distinct (op, layouts) among the as_strided inputs' ancestors, on zeros of the
traced sizes.

Example::

    >>> truth = LayoutTruth(gm)   # roll(x) of a channels_last x, then as_strided(roll, ...)
    >>> truth.doubts([as_strided_node])[as_strided_node]
    "its input 'roll' has a traced layout that is not eager PyTorch's: roll ('roll') is ..."
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx

from ..chains.chain import ViewChain
from ..compat import torch_internals as internals
from ..compat.torch_internals import OpOverload, pytree
from ..device_faults import raise_if_device_failed
from ..geometry.concrete import Geometry, equivalent
from ..graph_edits import argument_nodes, op_name
from ..op_tables import is_view_op
from ..random_state import forked_rng
from ..schema import LAYOUT_DOUBT, LAYOUT_FACT, REAL_LAYOUTS
from .aliasing import AliasAnalysis
from .as_strided_calls import as_strided_op, bind_as_strided

aten = torch.ops.aten


#: Namespaces whose ops run on fresh tensors without effects beyond their outputs and their
#: written arguments (collectives, custom ops and higher-order ops may not).
_RUNNABLE_NAMESPACES = ("aten", "prims")
#: Nodes whose recorded layout is the caller's: graph inputs and constants.
_TRUSTED = ("placeholder", "get_attr")
#: Variants whose own output layout the engine reads (a copy, a scatter's output).
_OWN_LAYOUT_READ = (aten.as_strided_copy.default, aten.as_strided_scatter.default)
#: How many distinct eager runs the process keeps (each entry is a few small tuples).
_CACHE_SIZE = 8192


@dataclass(frozen=True)
class _Unchecked:
    """Why a node's eager layout could not be computed."""

    reason: str


@dataclass(frozen=True)
class _Spec:
    """A fresh tensor to run a kernel on: its dtype, device, eager layout and storage size."""

    dtype: torch.dtype
    device: torch.device
    geometry: Geometry
    storage: int  # elements

    def make(self) -> torch.Tensor:
        storage = torch.zeros(self.storage, dtype=self.dtype, device=self.device)
        g = self.geometry
        return storage.as_strided(g.sizes, g.strides, g.offset)


@dataclass(frozen=True)
class _Scalar:
    """A 0-dim tensor whose value the graph fixes (see :meth:`LayoutTruth._argument`)."""

    value: Any
    dtype: torch.dtype
    device: torch.device

    def make(self) -> torch.Tensor:
        return torch.tensor(self.value, dtype=self.dtype, device=self.device)


#: (op, arguments with tensors as _Spec) -> the result's layouts (a pytree of Geometry | None),
#: or the _Unchecked of a kernel that failed. Process-wide, least recently used out.
_EAGER_RUNS: OrderedDict[Any, Any] = OrderedDict()
#: Rewrites may run in several threads at once (``fxviews.rewrite`` takes no lock).
_EAGER_RUNS_LOCK = threading.Lock()


class LayoutTruth:
    """The eager layouts of a graph's values, checked against their traced ones (see Note).

    Example::

        >>> LayoutTruth(gm).doubts(as_strided_nodes)
        {as_strided: "its input 'roll' has a traced layout that is not eager PyTorch's: ..."}
    """

    def __init__(self, graph_module: torch.fx.GraphModule) -> None:
        self.trusted = bool(graph_module.meta.get(REAL_LAYOUTS, False))
        # Per node: its eager result's layouts (a pytree of Geometry | None) or _Unchecked.
        self._eager: dict[torch.fx.Node, Any] = {}
        # Per node whose traced layout is not eager's: the node where the difference arose.
        self._origin: dict[torch.fx.Node, torch.fx.Node] = {}

    def doubts(self, nodes: Sequence[torch.fx.Node]) -> dict[torch.fx.Node, str]:
        """Why each of the as_strided-family ``nodes`` cannot be proven against its traced
        layouts (only the doubted ones); each also gets ``meta[LAYOUT_DOUBT]``."""
        if self.trusted or not nodes:
            return {}
        sources = {node: _source(node) for node in nodes}
        self._compute(sources)
        found = {}
        for node, source in sources.items():
            reason = self._doubt(node, source)
            if reason is not None:
                node.meta[LAYOUT_DOUBT] = reason
                found[node] = reason
        return found

    def layout_doubt(self, node: torch.fx.Node) -> tuple[bool, str | None]:
        """Whether ``node``'s traced layout is proven not eager's, and why it cannot be taken
        as eager's: (True, how they differ), (False, why it could not be checked), or
        (False, None) where it is eager's (or the graph's layouts are real).

        Example::

            >>> LayoutTruth(gm).layout_doubt(roll_node)   # roll of a channels_last input
            (True, "its traced layout is not eager PyTorch's: roll ('roll') is traced as ...")
        """
        if self.trusted or node.op in _TRUSTED:
            return False, None
        self._compute({node: node})
        eager = self._eager[node]
        if isinstance(eager, _Unchecked):
            return False, eager.reason
        if node in self._origin:
            return True, (
                f"its traced layout is not eager PyTorch's: "
                f"{self._disagreement(self._origin[node])}"
            )
        return False, None

    def eager_layout(self, node: torch.fx.Node) -> Geometry | None:
        """The layout eager PyTorch gives ``node``'s tensor, where :meth:`doubts` computed it."""
        value = self._eager.get(node)
        return value if isinstance(value, Geometry) else None

    def _compute(self, sources: dict[torch.fx.Node, torch.fx.Node | None]) -> None:
        """Eager layouts of every node the as_strided nodes (with their ``sources``) read, in
        graph order."""
        needed: set[torch.fx.Node] = set()
        todo = [source for source in sources.values() if source is not None]
        todo += [n for n in sources if as_strided_op(n) in _OWN_LAYOUT_READ]
        while todo:
            node = todo.pop()
            if node not in needed:
                needed.add(node)
                todo.extend(_inputs_read(node))
        if not needed:
            return
        graph = next(iter(sources)).graph
        with _quiet_and_seeded(needed):
            for node in graph.nodes:
                if node in needed:
                    self._eager[node] = self._eager_layouts(node)
                    if node.op not in _TRUSTED and not _is_fact(node):
                        self._note_origin(node)

    def _eager_layouts(self, node: torch.fx.Node) -> Any:
        if node.op in _TRUSTED:
            return _traced_layouts(node)  # the caller's (see Note, 1)
        fact = node.meta.get(LAYOUT_FACT)
        if fact is not None:  # see Note, 1
            if fact.trusted:
                return _traced_layouts(node)
            if fact.same_as is not None:
                return self._eager[fact.same_as]
            return _Unchecked(f"{node.name!r}: {fact.unknown}")
        if _picks_a_result(node):
            parent, index = node.args
            value = self._eager[parent] if isinstance(parent, torch.fx.Node) else None
            if isinstance(value, _Unchecked):
                return value
            try:
                return value[index]  # type: ignore[index]
            except (TypeError, IndexError, KeyError):
                return _Unchecked(f"{node.name!r} indexes a value without layouts")
        run = _runnable(node)
        if isinstance(run, _Unchecked):
            return run
        arguments = _inputs_of(node)
        for argument in arguments:
            if isinstance(self._eager[argument], _Unchecked):
                return self._eager[argument]
        if is_view_op(run) and not any(a in self._origin for a in arguments):
            return _traced_layouts(node)  # a view of agreeing inputs (see Note, 2)
        # Only an as_strided reads past its input, into the rest of the storage: anything else
        # gets a storage its input's elements span, not the whole buffer it views.
        whole = as_strided_op(node) is not None
        try:
            args, kwargs = torch.fx.node.map_arg(
                (node.args, node.kwargs), lambda a: self._argument(a, whole)
            )
        except _NotRunnable as err:
            return _Unchecked(f"{node.name!r}: {err}")
        return _run_cached(node, run, args, kwargs)

    def _argument(self, node: torch.fx.Node, whole_storage: bool) -> Any:
        """A node's value as a kernel argument: a _Spec for a tensor (over the traced storage's
        size if ``whole_storage``), a hint for a SymInt."""
        val = _value(node)
        constant = internals.fake_constant(val)
        if constant is not None and constant.dim() == 0:
            # A number the graph computed as a tensor (a size from torch.div of Python ints):
            # the kernel reads its value, which zeros would not give, and a scalar has no layout.
            return _Scalar(constant.item(), constant.dtype, val.device)
        if isinstance(val, torch.Tensor):
            eager = self._eager.get(node)
            if not isinstance(eager, Geometry):
                raise _NotRunnable(f"its argument {node.name!r} has no eager layout")
            if val.device.type == "meta":  # see Note, 2
                raise _NotRunnable(
                    f"its argument {node.name!r} was traced on the meta device, which has no "
                    "eager kernels"
                )
            storage = eager.storage_extent()
            if whole_storage:
                storage = max(storage, _storage_elements(val))
            return _Spec(val.dtype, val.device, eager, storage)
        return _hinted(val)

    def _note_origin(self, node: torch.fx.Node) -> None:
        """Record where ``node``'s traced layout stopped being eager's, if it did."""
        eager, traced = self._eager[node], _traced_layouts(node)
        if isinstance(eager, _Unchecked) or _same_layouts(eager, traced):
            return
        upstream = [a for a in _inputs_read(node) if a in self._origin]
        self._origin[node] = self._origin[upstream[0]] if upstream else node

    def _doubt(self, node: torch.fx.Node, source: torch.fx.Node | None) -> str | None:
        if source is not None:
            eager = self._eager[source]
            if isinstance(eager, _Unchecked):
                return (
                    f"its input {source.name!r} has a traced layout that could not be checked "
                    f"against eager PyTorch's: {eager.reason}"
                )
            if source in self._origin:
                return (
                    f"its input {source.name!r} has a traced layout that is not eager "
                    f"PyTorch's: {self._disagreement(self._origin[source])}"
                )
        if as_strided_op(node) in _OWN_LAYOUT_READ:
            if isinstance(self._eager[node], _Unchecked):
                return f"its own layout could not be checked: {self._eager[node].reason}"
            if node in self._origin:
                return f"its traced layout is not eager PyTorch's: {self._disagreement(node)}"
        return None

    def _disagreement(self, origin: torch.fx.Node) -> str:
        traced, eager = _traced_layouts(origin), self._eager[origin]
        return (
            f"{op_name(origin.target)} ({origin.name!r}) is traced as {_describe(traced)}, "
            f"its eager kernel gives {_describe(eager)}"
        )


def chain_for_any_layout(chain: ViewChain, node: torch.fx.Node) -> tuple[ViewChain | None, str]:
    """A chain proven against the eager layout of ``node``'s input, for a compiler that may lay
    that input out otherwise: each ``view`` (the one step that needs a layout) a ``reshape``,
    where a copy cannot be told from the view; None and why where it can.

    Example::

        >>> chain = (ViewStep(aten.t.default, ()), ViewStep(aten.view.default, ([5, 6],)))
        >>> chain_for_any_layout(chain, node)[0][1].op
        aten.reshape.default
    """
    if all(step.op is not aten.view.default for step in chain):
        return chain, ""
    observed = AliasAnalysis(node.graph).why_observed(node)
    if observed is not None:
        return None, f"its view must stay one, and needs eager's layout ({observed})"
    reshaped = (
        dataclasses.replace(step, op=aten.reshape.default) if step.op is aten.view.default else step
        for step in chain
    )
    return tuple(reshaped), ""


class _NotRunnable(Exception):
    """A node's arguments cannot all be made for an eager run."""


def _source(node: torch.fx.Node) -> torch.fx.Node | None:
    """The tensor whose traced layout an as_strided-family node is proven against: its input
    (a scatter's ``src`` is read by its logical values: its layout means nothing to it)."""
    source = bind_as_strided(node)["self"]
    return source if isinstance(source, torch.fx.Node) else None


def _picks_a_result(node: torch.fx.Node) -> bool:
    """Whether ``node`` picks one of a multi-output op's results (``getitem`` of a tuple),
    rather than indexing a tensor (``x[None, :]`` in a Dynamo graph): the latter runs."""
    if node.op != "call_function" or node.target is not operator.getitem:
        return False
    parent = node.args[0]
    return not (isinstance(parent, torch.fx.Node) and isinstance(_value(parent), torch.Tensor))


def _is_fact(node: torch.fx.Node) -> bool:
    """Whether the caller vouches for ``node``'s layout or says none can (no kernel to check)."""
    fact = node.meta.get(LAYOUT_FACT)
    return fact is not None and fact.same_as is None


def _inputs_read(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes whose eager layouts ``node``'s is computed from (none for a stated fact)."""
    if _is_fact(node):
        return []
    fact = node.meta.get(LAYOUT_FACT)
    return [fact.same_as] if fact is not None else _inputs_of(node)


def _inputs_of(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes ``node`` reads whose values are tensors (or tensor lists)."""
    return [a for a in argument_nodes((node.args, node.kwargs)) if _has_tensors(a)]


def _value(node: torch.fx.Node) -> Any:
    """``node``'s traced value; for a constant without one, the tensor the module holds."""
    val = node.meta.get("val")
    module = node.graph.owning_module
    if val is None and node.op == "get_attr" and module is not None:
        owner: Any = module
        for name in str(node.target).split("."):
            owner = getattr(owner, name, None)
        return owner
    return val


def _has_tensors(node: torch.fx.Node) -> bool:
    return any(isinstance(v, torch.Tensor) for v in pytree.tree_leaves(_value(node)))


def _runnable(node: torch.fx.Node) -> Any:
    """The callable that computes ``node`` eagerly, or _Unchecked saying why none may run."""
    target = node.target
    if node.op == "call_function" and isinstance(target, OpOverload):
        if target.namespace in _RUNNABLE_NAMESPACES:
            return target
        return _Unchecked(f"{op_name(target)} ({node.name!r}) is not an aten op to run for it")
    module = str(getattr(target, "__module__", None) or "")
    if node.op == "call_function" and module.split(".")[0] in ("torch", "_operator"):
        return target  # a torch function or a Python operator (symbolic_trace graphs)
    if node.op == "call_function" and target is getattr:
        return target  # a tensor's property in a Dynamo graph (``w.mT``, ``x.real``)
    if node.op == "call_method" and isinstance(target, str):
        return _Method(target)
    return _Unchecked(f"{node.name!r} ({node.op} {target}) has no eager kernel to run for it")


@dataclass(frozen=True)
class _Method:
    """A ``call_method`` node's call: the method ``name`` of its first argument."""

    name: str

    def __call__(self, owner: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(owner, self.name)(*args, **kwargs)


def _run_cached(node: torch.fx.Node, run: Any, args: Any, kwargs: Any) -> Any:
    """The layouts of ``run(*args, **kwargs)`` on fresh zeros, once per distinct call."""
    try:
        key = (run, _frozen(args), _frozen(kwargs))
        hash(key)
    except TypeError:  # an argument without a hashable form: run, do not cache
        key = None
    if key is not None:
        with _EAGER_RUNS_LOCK:
            if key in _EAGER_RUNS:
                _EAGER_RUNS.move_to_end(key)
                return _EAGER_RUNS[key]
    # A failure is an answer (the layout stays unchecked) unless the device failed: then it
    # is fatal (Note [A device error is fatal] in device_faults).
    leaves = pytree.tree_leaves((args, kwargs))
    devices = {v.device for v in leaves if isinstance(v, _Spec | torch.Tensor)}
    what = f"the eager kernel of {op_name(node.target)} ({node.name!r})"
    try:
        # On the traced device: a kernel's layouts may differ between devices (CUDA's from
        # CPU's), and one this process cannot reach (fake CUDA tensors on a machine without
        # CUDA) leaves the layout unchecked rather than checked on another device.
        real_args, real_kwargs = pytree.tree_map(
            lambda v: v.make() if isinstance(v, _Spec | _Scalar) else v, (args, kwargs)
        )
    except Exception as err:  # noqa: BLE001 - torch raises RuntimeError or AssertionError
        raise_if_device_failed(err, devices, f"making the arguments of {what}")
        result = _Unchecked(
            f"no tensor for {what} can be made on its traced device here ({_first_line(err)})"
        )
    else:
        try:
            out = run(*real_args, **real_kwargs)
            result = pytree.tree_map(_layout_of, out)
        except Exception as err:  # noqa: BLE001 - any other failure leaves the layout unchecked
            raise_if_device_failed(err, devices, what)
            result = _Unchecked(f"{what} fails on zeros of the traced layouts ({_first_line(err)})")
    if key is not None:
        with _EAGER_RUNS_LOCK:
            _EAGER_RUNS[key] = result
            if len(_EAGER_RUNS) > _CACHE_SIZE:
                _EAGER_RUNS.popitem(last=False)
    return result


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def _frozen(value: Any) -> Any:
    """A hashable form of a kernel's arguments (lists become tuples)."""
    if isinstance(value, list | tuple):
        return (type(value).__name__, *(_frozen(v) for v in value))
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    return value


def _layout_of(value: Any) -> Geometry | None:
    if isinstance(value, torch.Tensor) and value.layout == torch.strided:
        return Geometry.of(value)
    return None


def _traced_layouts(node: torch.fx.Node) -> Any:
    """The layouts ``node``'s ``meta["val"]`` records (a pytree of Geometry | None), at the
    symbols' trace-time values; _Unchecked where a tensor's layout has no such value."""
    val = _value(node)
    try:
        if isinstance(val, torch.Tensor):  # most nodes: no pytree walk
            return _hinted_layout(val)
        return pytree.tree_map(_hinted_layout, val)
    except _NotRunnable as err:
        return _Unchecked(f"{node.name!r}: {err}")


def _hinted_layout(value: Any) -> Geometry | None:
    if not isinstance(value, torch.Tensor):
        return None
    if value.layout != torch.strided:
        raise _NotRunnable(f"its traced value has the layout {value.layout}")
    g = Geometry.of(value)
    return Geometry(
        tuple(_hinted(s) for s in g.sizes),
        tuple(_hinted(s) for s in g.strides),
        _hinted(g.offset),
    )


def _storage_elements(val: torch.Tensor) -> int:
    """Elements of the storage under a traced tensor (0 where it has none to read)."""
    try:
        nbytes = _hinted(val.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return 0
    return int(nbytes) // val.element_size()


def _hinted(value: Any) -> Any:
    """A SymInt/SymFloat/SymBool at the symbols' trace-time values (anything else as is)."""
    if not isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return value
    node = value.node
    expr = sympy.sympify(node.expr).xreplace(internals.symbol_hints(node.shape_env))
    if expr.free_symbols:
        raise _NotRunnable(f"{value} has no trace-time value (a data-dependent size)")
    if isinstance(value, torch.SymBool):
        return bool(expr)
    return int(expr) if isinstance(value, torch.SymInt) else float(expr)


def _same_layouts(eager: Any, traced: Any) -> bool:
    if isinstance(traced, _Unchecked):
        return False
    if isinstance(eager, Geometry) and isinstance(traced, Geometry):
        return equivalent(eager, traced)
    eager_leaves = pytree.tree_leaves(eager, is_leaf=lambda v: isinstance(v, Geometry))
    traced_leaves = pytree.tree_leaves(traced, is_leaf=lambda v: isinstance(v, Geometry))
    if len(eager_leaves) != len(traced_leaves):
        return False
    return all(
        (a is None) == (b is None) and (a is None or equivalent(a, b))
        for a, b in zip(eager_leaves, traced_leaves, strict=True)
        if isinstance(a, Geometry) or isinstance(b, Geometry)
    )


def _describe(layouts: Any) -> str:
    """``strides [50, 10, 5, 1] at offset 0`` (the sizes agree: only layouts differ)."""
    leaves = pytree.tree_leaves(layouts, is_leaf=lambda v: isinstance(v, Geometry))
    return "; ".join(
        f"strides {list(g.strides)} at offset {g.offset}" for g in leaves if isinstance(g, Geometry)
    )


@contextlib.contextmanager
def _quiet_and_seeded(nodes: Iterable[torch.fx.Node]) -> Iterator[None]:
    """Eager runs leave no trace: no autograd graph, no warnings, the random state restored
    (the generators the nodes' arguments name included)."""
    with forked_rng([(_value(n), n.args, n.kwargs) for n in nodes]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            yield
