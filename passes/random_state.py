"""Forking the random generators a run may advance, and telling its draws from Python's seeding.

Note [Which generators to fork]
-------------------------------
fxviews runs kernels for its own purposes (a real-mode trace, a recording, layout truth's eager
runs) and must leave every random stream as it found it. ``torch.random.fork_rng`` saves and
restores the CPU generator and the CUDA generators it is given. The CUDA ones are those of the
devices holding tensors among the values at hand (a kernel runs on its arguments' device), and
only the ones this process can reach: a graph traced on fake CUDA tensors can be rewritten on a
machine without CUDA (an export for a GPU, made on a CPU host), where no kernel can run on them
and so advance a generator, and where asking CUDA for its state fails. Every
``torch.Generator`` among the values is forked too: a function drawing from its own generator
(``torch.rand(3, generator=g)``, ``g`` an argument, closed over, or held by a module) would
otherwise find it advanced by the trace's runs, and eager's first draw lost for good.

Note [Random state set from Python]
-----------------------------------
A graph replays ops; ``torch.manual_seed``, ``fork_rng``, ``set_rng_state`` and a generator's
``manual_seed`` or ``set_state`` are none, so a graph of a function that calls them draws on
from wherever the stream is (eager reseeds every call, or leaves the caller's stream alone).
Which Python function did it does not matter: :class:`RandomDraws` watches the generators
themselves. Between two draws a generator's state changes only by a draw, so before each op
tagged ``nondeterministic_seeded`` the state of the generator it draws from (its ``generator``
argument, else its device's default) must be the one it had after the previous draw (or when
the watch began), and so must every generator's when the watch ends. In fake mode no kernel
runs and draws change nothing, which the same comparison covers. A draw from a generator the
watch was not given is refused too: one the function makes itself, which the graph would keep
(the trace's object, advanced by every later call) where eager makes a fresh one. An op gets a
fresh Python object around its generator, so which watched one it is, is found by reseeding
each candidate for a moment (:func:`_same_generator`). In fake mode no kernel draws, so the
watch moves a forked generator on itself after each draw: a state saved before a draw and
restored after it (``fork_rng``) then shows too. Only random ops pay: two ``get_state`` reads
and byte comparisons (a few microseconds on CPU), plus the probe for an explicit generator.


Example::

    >>> with forked_rng([torch.ones(2)]):
    ...     _ = torch.rand(1)   # the CPU stream is as before after the block
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from .compat.torch_internals import no_dispatch, no_torch_function, pytree

__all__ = [
    "RandomDraws",
    "RandomStateFromPython",
    "forked_rng",
    "generators_among",
    "reachable_cuda_devices",
]


def reachable_cuda_devices(values: Any) -> list[int]:
    """The indices of the CUDA devices holding tensors among the pytree ``values`` that this
    process can use (none without CUDA), sorted.

    Example::

        >>> reachable_cuda_devices([torch.ones(2)])
        []
    """
    wanted = {
        leaf.device.index
        for leaf in pytree.tree_leaves(values)
        if issubclass(type(leaf), torch.Tensor) and leaf.device.type == "cuda"
    }
    if not wanted or not torch.cuda.is_available():
        return []
    count = torch.cuda.device_count()
    found = {torch.cuda.current_device() if index is None else index for index in wanted}
    return sorted(index for index in found if index < count)


def generators_among(values: Any) -> list[torch.Generator]:
    """The ``torch.Generator`` objects among the pytree ``values``, each once.

    Example::

        >>> g = torch.Generator()
        >>> generators_among([g, (1, g)]) == [g]
        True
    """
    found: dict[int, torch.Generator] = {}
    for leaf in pytree.tree_leaves(values):
        if issubclass(type(leaf), torch.Generator):  # never a __class__ of the user's
            found.setdefault(id(leaf), leaf)
    return list(found.values())


@contextlib.contextmanager
def forked_rng(values: Any) -> Iterator[None]:
    """Restore the CPU generator, those of :func:`reachable_cuda_devices` and every generator
    among ``values`` afterwards (Note [Which generators to fork])."""
    generators = generators_among(values)
    states = [generator.get_state() for generator in generators]
    try:
        with torch.random.fork_rng(devices=reachable_cuda_devices(values)):
            yield
    finally:
        for generator, state in zip(generators, states, strict=True):
            generator.set_state(state)


class RandomStateFromPython(RuntimeError):
    """A traced function sets a generator's state from Python, or draws from a generator it
    makes (Note [Random state set from Python]): a graph cannot replay either."""


#: Why a graph cannot replay a state change made between draws, in the user's terms.
SET_FROM_PYTHON = (
    "it sets the random state from Python (torch.manual_seed / fork_rng / set_rng_state, or a "
    "generator's manual_seed / set_state): a graph cannot replay that"
)


#: Why a graph cannot keep a generator the function makes.
MADE_WHILE_RUNNING = (
    "it draws from a torch.Generator it makes while it runs (or reaches only through an "
    "attribute): a graph would keep the trace's generator, where eager draws from the new one"
)


class RandomDraws:
    """Refuses random state a graph would not replay (Note [Random state set from Python]).

    ``generators`` are those the function may draw from besides the default ones (its
    arguments', those it reaches); the CPU default generator and those of the CUDA devices of
    ``values`` are watched from the start, any other device's default from its first draw.

    Example::

        >>> draws = RandomDraws([], [x])
        >>> with draws:
        ...     torch.manual_seed(0)   # RandomStateFromPython on leaving the block
    """

    def __init__(self, generators: Sequence[torch.Generator], values: Any) -> None:
        cuda = [torch.cuda.default_generators[index] for index in reachable_cuda_devices(values)]
        self._watched = [torch.default_generator, *cuda, *generators]
        self._forked = {id(g) for g in self._watched}  # those the trace's caller restores
        self._states: dict[int, bytes] = {}

    def __enter__(self) -> RandomDraws:
        self._states = {id(g): _state(g) for g in self._watched}
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        if kind is None and any(self._states[id(g)] != _state(g) for g in self._watched):
            raise RandomStateFromPython(SET_FROM_PYTHON)

    def before(self, func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Check the generator ``func`` is about to draw from; returns it for :meth:`after`
        (None: ``func`` draws nothing, or from a device with no generator to read here)."""
        if torch.Tag.nondeterministic_seeded not in func.tags:
            return None
        given = kwargs.get("generator")
        if given is None:
            generator = self._default_for(_device_of(args, kwargs))
            if generator is None:
                return None
        else:
            generator = self._watched_as(given)
            if generator is None:
                raise RandomStateFromPython(MADE_WHILE_RUNNING)
        if self._states[id(generator)] != _state(generator):
            raise RandomStateFromPython(SET_FROM_PYTHON)
        return generator

    def _default_for(self, device: torch.device) -> torch.Generator | None:
        """``device``'s default generator, watched from now on if it was not (None: none to
        read here)."""
        generator = _default_generator(device)
        if generator is not None and id(generator) not in self._states:
            self._watched.append(generator)
            self._states[id(generator)] = _state(generator)
        return generator

    def _watched_as(self, seen: torch.Generator) -> torch.Generator | None:
        """The watched generator ``seen`` is, None if none: an op's ``generator`` argument
        reaches a dispatch mode as a fresh Python object around the same generator, so identity
        says nothing, and equal states do not tell two generators seeded alike apart."""
        return next(
            (g for g in self._watched if g.device == seen.device and _same_generator(g, seen)),
            None,
        )

    def after(self, generator: Any) -> None:
        """Note the state the draw left ``generator`` in (what :meth:`before` returned)."""
        if generator is None:
            return
        state = _state(generator)
        if state == self._states[id(generator)] and id(generator) in self._forked:
            # No kernel drew (fake mode): move the generator on as a draw would, or a state
            # saved before the draw and restored after it (fork_rng) would go unseen.
            with no_dispatch(), no_torch_function():
                generator.manual_seed(generator.initial_seed() ^ 1)
            state = _state(generator)
        self._states[id(generator)] = state


def _state(generator: torch.Generator) -> bytes:
    """``generator``'s state, as bytes: they compare without an op the trace's modes would see
    (torch.equal), and are read below every mode (fake mode would make get_state's tensor, and
    the recording would take ``numpy`` for the function's read of tensor memory)."""
    with no_dispatch(), no_torch_function():
        return bytes(generator.get_state().numpy())


def _same_generator(known: torch.Generator, seen: torch.Generator) -> bool:
    """Whether the Python objects ``known`` and ``seen`` hold one generator: reseeding
    ``known`` to a seed ``seen`` does not have shows in ``seen`` only then. ``known`` is put
    back as it was."""
    with no_dispatch():
        state = known.get_state()
        probe = seen.initial_seed() ^ 1
        try:
            known.manual_seed(probe)
            return seen.initial_seed() == probe
        finally:
            known.set_state(state)


def _device_of(args: Sequence[Any], kwargs: dict[str, Any]) -> torch.device:
    """The device an op runs on: its ``device`` argument, else its first tensor's, else CPU."""
    device = kwargs.get("device")
    if device is not None:
        return torch.device(device)
    for leaf in pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor):
            return leaf.device
    return torch.device("cpu")


def _default_generator(device: torch.device) -> torch.Generator | None:
    """The default generator of ``device``, None where this process has none to read (a fake
    CUDA tensor's device on a machine without CUDA, the meta device)."""
    if device.type == "cpu":
        return torch.default_generator
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.default_generators[device.index or torch.cuda.current_device()]
    return None
