"""The transform's output rebuilder gives the tree ``pytree.tree_unflatten`` gives."""

from __future__ import annotations

import collections

import pytest
import torch

from fxviews.calls.rebuilding import output_rebuilder
from fxviews.passes.compat.torch_internals import pytree

Pair = collections.namedtuple("Pair", "a b")

TREES = {
    "leaf": "t",
    "pair of pairs": (("t", "t"), ("t", "t")),
    "one-element tuple": ("t",),
    "empty tuple": (),
    "list with constants": ["t", None, 3, ("t", 2.5)],
    "nested lists": [["t"], [], [["t", "t"]]],
    "dict": {"primal": "t", "tangent": ("t", None)},
    "namedtuple": Pair("t", ["t", 7]),
}


def _tree(template: object) -> tuple[object, list[torch.Tensor]]:
    """``template`` with a distinct tensor at each "t"; the tensors in order."""
    tensors: list[torch.Tensor] = []

    def fill(leaf: object) -> object:
        if leaf == "t":
            tensors.append(torch.full((2,), float(len(tensors))))
            return tensors[-1]
        return leaf

    return pytree.tree_map(fill, template), tensors


@pytest.mark.parametrize("name", TREES)
def test_rebuilt_tree_equals_tree_unflatten(name: str) -> None:
    tree, tensors = _tree(TREES[name])
    leaves, spec = pytree.tree_flatten(tree)
    from_graph = tuple(isinstance(leaf, torch.Tensor) for leaf in leaves)
    constants = tuple(leaf for leaf in leaves if not isinstance(leaf, torch.Tensor))
    rebuilt = output_rebuilder(spec, from_graph, constants)(tensors)
    expected = pytree.tree_unflatten(leaves, spec)
    assert pytree.tree_structure(rebuilt) == pytree.tree_structure(expected)
    assert type(rebuilt) is type(expected)
    for got, want in zip(pytree.tree_leaves(rebuilt), leaves, strict=True):
        assert got is want
