"""Random programs over an input of symbolic shape, traced symbolically and rewritten.

Each example is a function ``fn(x)`` of an input whose every size is a symbol: a base ``y`` of
``x`` (``x`` itself, a clone, a product, a transpose, its contiguous copy, or a narrowed view),
a chain of view ops on ``y`` whose arguments are affine in the current sizes (narrow, slice
with a step and an end counted from the size, select at a constant or at ``size - k``,
diagonal with an offset, unfold, permute, flatten of contiguous dims, expand), and then
``y.as_strided(v.shape, v.stride(), v.storage_offset())`` for ``v`` the chain applied to
``y``: sizes, strides and offset are SymInt expressions. A few targets are perturbed (one size
pinned to its value at the hint, or the offset moved by one) so that they read past what ``y``
exposes at some sizes but not at the hint, and the kept path runs too.

Every chain step is valid at sizes of at least :data:`MIN_SIZE` (each size it produces only
grows with the input's sizes, and the chain is drawn against an input of exactly those sizes),
and the hint is drawn there with distinct sizes (equal ones would be traced as one symbol).
``make_fx(fn, tracing_mode="symbolic")`` at the hint, then :func:`fxviews.rewrite`. Checked:

1. at the hint and at other sizes (some below :data:`MIN_SIZE`, where eager may raise), on
   contiguous inputs, the rewritten graph gives eager ``fn``'s values or raises where it does;
   sizes outside the guards the trace itself recorded are outside the graph's domain and are
   only counted;
2. if the as_strided was rewritten, ``vmap`` of the rewritten graph over samples stacked with
   the batch dim physically at a drawn position equals eager ``fn`` per sample, at each size
   (a view merging dims of the input, returned as its alias, may raise there instead: the
   caller owns that layout and layout pinning keeps it, with a reason);
3. a kept node says why;
4. the rewrite added no guard to the graph's ShapeEnv and left the caller's graph as it was.

Symbolic traces are slow, so the default is :data:`SETTINGS` of ``test_geometry`` cut to
:data:`DEFAULT_EXAMPLES`; ``FXVIEWS_EXAMPLES`` (``make fuzz``) sets the count as for every
other property.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from hypothesis import event, example, given, note, settings
from hypothesis import strategies as st

import fxviews
from fxviews.passes.compat.torch_internals import make_fx
from fxviews.passes.schema import RecordKind
from tests.differential import WRONG_RESULT, vmap_failures
from tests.reference import make_samples, stable_seed
from tests.test_geometry import SETTINGS
from tests.test_symbolic import outcome

#: Every chain step is valid when each of the input's sizes is at least this.
MIN_SIZE = 6
#: Sizes are drawn up to this (the hint's and the other sizes the graph runs at).
MAX_SIZE = 12
#: A symbolic make_fx trace, rewrite and the runs at four sizes take a tenth of a second to
#: half a second: fewer examples than the static properties (the file takes 10-40 s on a
#: shared machine) unless ``FXVIEWS_EXAMPLES`` asks for a number.
DEFAULT_EXAMPLES = 100
SYMBOLIC_SETTINGS = settings(
    SETTINGS, max_examples=int(os.environ.get("FXVIEWS_EXAMPLES", DEFAULT_EXAMPLES))
)
BATCH = 3

View = Callable[[torch.Tensor], torch.Tensor]
#: Steps of slices and unfolds: half of them 1. A step above 1 sizes a dim by a floor
#: division, which the engine proves with a remainder of known range (rewritten where the
#: chain's slice ends and window counts follow the sizes in one form at every size).
STEPS = st.sampled_from([1, 1, 2, 3])


@dataclass(frozen=True)
class Step:
    """One view op of a chain: what it does, and how it reads in a failing example."""

    apply: View
    text: str


def along(dim: int, index: slice) -> tuple[slice, ...]:
    """The indexing tuple that applies ``index`` at ``dim`` and keeps every other dim."""
    return (slice(None),) * dim + (index,)


def draw_step(draw: st.DrawFn, smallest: torch.Tensor, contiguous: bool) -> tuple[Step, bool]:
    """A view op valid on ``smallest`` (the chain so far at the smallest input).

    Arguments are drawn against ``smallest``'s sizes and written relative to the size the op
    meets at run time, so the op is valid at every larger size too. Returns the step and
    whether its result is still contiguous (flatten needs that).
    """
    ndim = smallest.ndim
    kinds = ["narrow", "slice", "unfold", "expand"]
    kinds += ["select", "diagonal", "permute"] if ndim >= 2 else []
    kinds += ["flatten"] if contiguous and ndim >= 2 else []
    kind = draw(st.sampled_from(kinds))
    event(f"op: {kind}")
    dim = draw(st.integers(0, ndim - 1))
    size = smallest.shape[dim]
    # Each dim an op shrinks keeps two elements at the smallest input where it can: a size 1
    # at the hint makes the trace specialize (PyTorch asks whether it is 1), and the graph is
    # then only defined at that size.
    least = min(2, size)
    if kind in ("narrow", "slice"):
        start = draw(st.integers(0, size - least))
        cut = draw(st.integers(0, size - least - start))  # how far before the end it stops
        if kind == "narrow":
            step = Step(
                lambda t: t.narrow(dim, start, t.shape[dim] - start - cut),
                f"narrow({dim}, {start}, size - {start + cut})",
            )
            return step, contiguous and dim == 0
        stride = draw(STEPS)
        return Step(
            lambda t: t[along(dim, slice(start, t.shape[dim] - cut, stride))],
            f"[{start}:size-{cut}:{stride}] at {dim}",
        ), contiguous and dim == 0 and stride == 1
    if kind == "select":
        if draw(st.booleans()):
            back = draw(st.integers(1, size))
            return Step(
                lambda t: t.select(dim, t.shape[dim] - back), f"select({dim}, size - {back})"
            ), contiguous and dim == 0
        index = draw(st.integers(0, size - 1))
        return Step(
            lambda t: t.select(dim, index), f"select({dim}, {index})"
        ), contiguous and dim == 0
    if kind == "diagonal":
        other = draw(st.sampled_from([d for d in range(ndim) if d != dim]))
        least = min(least, smallest.shape[other])
        offset = draw(st.integers(least - size, smallest.shape[other] - least))
        return Step(
            lambda t: t.diagonal(offset, dim, other), f"diagonal({offset}, {dim}, {other})"
        ), False
    if kind == "unfold":
        stride = draw(STEPS)
        window = draw(st.integers(1, max(1, size - stride)))
        return Step(
            lambda t: t.unfold(dim, window, stride), f"unfold({dim}, {window}, {stride})"
        ), False
    if kind == "permute":
        order = draw(st.permutations(range(ndim)))
        return Step(lambda t: t.permute(order), f"permute({order})"), False
    if kind == "flatten":
        dim = min(dim, ndim - 2)
        return Step(lambda t: t.flatten(dim, dim + 1), f"flatten({dim}, {dim + 1})"), True
    # expand: a new dim of a constant size or of the size of one of the tensor's dims
    at = draw(st.integers(0, ndim))
    if draw(st.booleans()):
        count = draw(st.integers(2, 4))
        return Step(
            lambda t: t.unsqueeze(at).expand(*t.shape[:at], count, *t.shape[at:]),
            f"expand {count} at {at}",
        ), False
    return Step(
        lambda t: t.unsqueeze(at).expand(*t.shape[:at], t.shape[dim], *t.shape[at:]),
        f"expand size[{dim}] at {at}",
    ), False


#: Bases ``y`` of the input: name: (the base, whether it is contiguous).
BASES: dict[str, tuple[View, bool]] = {
    "input": (lambda x: x, True),
    "clone": (lambda x: x.clone(), True),
    "product": (lambda x: x * 2, True),
    "transposed": (lambda x: x.transpose(0, -1), False),
    "transposed copy": (lambda x: x.transpose(0, -1).contiguous(), True),
    "narrowed": (lambda x: x[1:-1], True),
}


@dataclass(frozen=True)
class Program:
    """``fn(x)``: ``y = base(x)``, then ``y.as_strided`` of the geometry of ``steps(y)``.

    ``pinned`` replaces one size of that geometry by its value at the hint (``(dim, value)``),
    and ``shift`` moves its offset: the targets that may read past ``y`` at other sizes.
    """

    base: str
    steps: tuple[Step, ...]
    pinned: tuple[int, int] | None = None
    shift: int = 0

    def chain(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The base ``y`` of ``x`` and the chain's view ``v`` of it."""
        y = view = BASES[self.base][0](x)
        for step in self.steps:
            view = step.apply(view)
        return y, view

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y, view = self.chain(x)
        sizes = list(view.shape)
        if self.pinned is not None:
            dim, value = self.pinned
            sizes[dim] = value
        return y.as_strided(sizes, view.stride(), view.storage_offset() + self.shift)

    def __str__(self) -> str:
        steps = " -> ".join(step.text for step in self.steps) or "nothing"
        return f"base {self.base}, {steps}, pinned {self.pinned}, shift {self.shift}"


def smallest_input(ndim: int) -> torch.Tensor:
    """An input of the smallest sizes every drawn program is valid at."""
    return torch.zeros((MIN_SIZE,) * ndim)


@st.composite
def programs(draw: st.DrawFn) -> tuple[Program, tuple[int, ...]]:
    """A program and the hint it is traced at (distinct sizes, each at least MIN_SIZE)."""
    ndim = draw(st.sampled_from([2, 3, 1]))  # most ops need two dims
    hint = tuple(
        draw(st.lists(st.integers(MIN_SIZE, MAX_SIZE), min_size=ndim, max_size=ndim, unique=True))
    )
    base = draw(st.sampled_from(sorted(BASES)))
    smallest = BASES[base][0](smallest_input(ndim))
    contiguous = BASES[base][1] or ndim == 1
    steps: list[Step] = []
    for _ in range(draw(st.integers(1, 3))):
        step, contiguous = draw_step(draw, smallest, contiguous)
        steps.append(step)
        smallest = step.apply(smallest)
    program = Program(base, tuple(steps))
    # One target in four may read past ``y`` at some sizes (and so exercise the kept path).
    unsafe = draw(st.sampled_from(["pinned", "shift"])) if draw(st.integers(0, 3)) == 0 else None
    if unsafe == "shift":
        program = Program(base, tuple(steps), shift=1)
    elif unsafe == "pinned" and smallest.ndim:
        dim = draw(st.integers(0, smallest.ndim - 1))
        at_hint = program.chain(torch.zeros(hint))[1].shape[dim]
        program = Program(base, tuple(steps), pinned=(dim, at_hint))
    event(f"target: {'pinned' if program.pinned else 'shift' if program.shift else 'as drawn'}")
    event(f"base: {base}")
    return program, hint


def traced_input(gm: torch.fx.GraphModule) -> torch.Tensor:
    """The fake value of ``gm``'s input, whose sizes are the trace's symbols."""
    return next(n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder")


def guards_hold(gm: torch.fx.GraphModule, x: torch.Tensor) -> bool:
    """Whether ``x`` satisfies the guards the trace recorded.

    Outside them the graph is not defined (Dynamo checks them before each call). A guard that
    fixed a symbol (``Eq(s0 - 5, 1)`` where a size 1 at the hint was asked whether it is 1)
    counts too: ``ignore_static=False``.
    """
    fake = traced_input(gm)
    shape_env = fake.shape[0].node.shape_env
    return shape_env.evaluate_guards_for_args([fake], [x], ignore_static=False)


#: Drawn on torch 2.11, whose trace does not guard the select's index: at size 2 the rewritten
#: graph raises from its as_strided (a RuntimeError) where eager's select raises an IndexError.
UNGUARDED_SELECT = Program(
    "clone",
    (
        Step(lambda t: t.unfold(0, 1, 1), "unfold(0, 1, 1)"),
        Step(lambda t: t.unfold(0, 1, 1), "unfold(0, 1, 1)"),
        Step(lambda t: t.select(0, 2), "select(0, 2)"),
    ),
)


@SYMBOLIC_SETTINGS
@example(
    drawn=(UNGUARDED_SELECT, (6,)),
    other_sizes=[2, 2, 2],
    larger_sizes=[7, 7, 7],
    position="first",
)
@given(
    drawn=programs(),
    other_sizes=st.lists(st.integers(2, MAX_SIZE), min_size=3, max_size=3),
    larger_sizes=st.lists(st.integers(MIN_SIZE, MAX_SIZE), min_size=3, max_size=3),
    position=st.sampled_from(["first", "middle", "last"]),
)
def test_symbolic_as_strided_is_rewritten_right_at_every_size_or_kept(
    drawn: tuple[Program, tuple[int, ...]],
    other_sizes: list[int],
    larger_sizes: list[int],
    position: str,
) -> None:
    program, hint = drawn
    note(str(program))
    ndim = len(hint)
    gm = make_fx(program, tracing_mode="symbolic")(torch.zeros(hint))
    shape_env = traced_input(gm).shape[0].node.shape_env
    guards, code = list(shape_env.guards), gm.code
    res = fxviews.rewrite(gm)
    # Property 4: a proof asks the ShapeEnv, never a SymInt for a bool (which adds a guard).
    assert shape_env.guards == guards and gm.code == code
    records = [r for r in res.records if r.kind is RecordKind.AS_STRIDED]
    assert records
    for record in records:
        event(f"method: {record.method}")
        event("rewritten" if record.method != "kept" else "kept")
        assert record.method != "kept" or record.reason, record  # property 3

    # Property 1, at the hint, at the smallest sizes drawn against, and at two more.
    sizes = [hint, (MIN_SIZE,) * ndim, tuple(larger_sizes[:ndim]), tuple(other_sizes[:ndim])]
    valid = []
    for shape in sizes:
        [(x,)] = make_samples([shape], 1, seed=stable_seed(str(shape)))
        if not guards_hold(gm, x):
            assert shape != hint, "the trace's own guards refuse its hint"
            event("a size outside the trace's guards")
            continue
        want, got = outcome(program, x), outcome(res.graph_module, x)
        if isinstance(want, torch.Tensor):
            torch.testing.assert_close(got, want, msg=f"at {shape}")
            valid.append(shape)
        else:
            # Eager raises: so must the graph, though not always with eager's error type.
            # torch 2.11's trace records no guard for a select past a symbolic size: its graph
            # raises from that select (dead: only its geometry was used), which the rewrite
            # removes, and then from the as_strided reading past the storage.
            assert isinstance(got, type), f"at {shape}: a value where eager raises {want}"

    if all(record.method == "kept" for record in records):
        return
    # Property 2: the rewritten views (unlike as_strided) follow the batch dim wherever it is.
    # A view merging dims of the caller's input and returned as its alias cannot be made
    # layout-free (README, "Layout pinning"): it is kept with a reason, and may raise under
    # vmap where the batch dim splits the merged dims, but never gives a wrong number.
    unpinnable = [r for r in res.pin_records if r.method == "kept"]
    assert all(r.reason for r in unpinnable), unpinnable
    batch_dim = {"first": 0, "middle": (ndim + 1) // 2, "last": ndim}[position]
    for shape in valid:
        samples = make_samples([shape], BATCH, seed=stable_seed(f"{shape} batched"))
        found = vmap_failures(res.graph_module, program, samples, [(batch_dim,)], label=str(shape))
        if found and unpinnable:
            event("vmap raises at a view of the input that cannot be pinned")
            assert not any(WRONG_RESULT in line for line in found), found
        else:
            assert not found, found
