"""Analysis: what the rewrites must know of a graph before they change it.

Which nodes are as_strided calls and their arguments (:mod:`.as_strided_calls`), which share
storage and who writes it (:mod:`.aliasing`), which bases expose what an as_strided reads
(:mod:`.exposing_bases`), whether a traced layout is the one eager kernels produce
(:mod:`.layout_truth`), and the example inputs a pass needs (:mod:`.example_inputs`). Takes a
GraphModule; gives facts about it and changes nothing. It imports chains, geometry, the
engine's shared modules and compat.
"""
