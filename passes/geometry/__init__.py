"""Geometry: sizes, strides and a storage offset, the facts every rewrite is proven against.

:mod:`.concrete` is the algebra on integers (addresses, containment, equivalence);
:mod:`.symbolic` the same as expressions in a graph's ShapeEnv, with proofs over every size.
Takes tensors' or nodes' layouts; gives :class:`~.concrete.Geometry` values and facts about
them. It imports only the compat layer.
"""
