"""torch.compile's ``backend="fxviews"``: Dynamo's graph rewritten before vmap's batching rules
and AOTAutograd read it, then AOTAutograd's graphs rewritten and handed to an inner compiler.

Takes Dynamo's GraphModule and example inputs; gives a compiled callable (:mod:`.backend`).
:mod:`.dynamo_stage` is the first stage, over Dynamo's graph, with the per-sample values under
vmap from :mod:`.dynamo_values`; :mod:`.write_hazards`, :mod:`.written_windows`,
:mod:`.storage_bounds`, :mod:`.batched_backwards`, :mod:`.layout_reads` and :mod:`.mode_regions`
each keep one kind of graph right that AOTAutograd or Dynamo would get wrong;
:mod:`.graph_splits` splits a graph around the nodes that must not reach AOTAutograd, so that
the rest compiles, and :mod:`.output_layouts` gives outputs eager's layouts.
"""
