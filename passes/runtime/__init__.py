"""Runtime: the engine where fxviews itself runs what it rewrote.

For a graph only fxviews runs (``transform``'s cache): results that depend on no input computed
once (:mod:`.constant_folding`) and ops called through PyTorch's Python bindings where proven
the same call (:mod:`.bound_calls`). On a live tensor, with no graph: an ``as_strided``
answered by its proven view chain (:mod:`.runtime_views`, ``fxviews.as_strided``). Takes
rewritten graphs or tensors; gives graphs cheaper to call, or views. It imports every
engine package below it.
"""
