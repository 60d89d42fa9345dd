"""Chains: the view ops an ``as_strided`` stands for, found, proven and written as graph nodes.

A :class:`~.chain.ViewChain` is found from the user's own views (:mod:`.provenance`) or
derived from two geometries (:mod:`.synthesis`, :mod:`.symbolic_synthesis`), used only once it
provably reproduces the target (:mod:`.verification`, :mod:`.symbolic_verification`), and
written as nodes (:mod:`.emission`), in the ops a consumer's opset has (:mod:`.opsets`,
:mod:`.copied_windows` for core ATen's lack of ``unfold``). Takes geometries and nodes; gives
chains and emitted nodes. It imports geometry, the engine's shared modules and compat.
"""
