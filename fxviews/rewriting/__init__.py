"""Rewriting: the engine's passes and the steps after them run on a GraphModule, and reported.

Takes a traced GraphModule (from :mod:`fxviews.tracing`, Dynamo or ``torch.export``); gives a
:class:`~.steps.RewriteResult`: the rewritten graph, one record per node a step handled, and the
printouts and logs of what changed (:mod:`.printouts`). :mod:`.steps` runs the engine
(:mod:`fxviews.passes`) and, for a graph only fxviews runs, the steps that make it cheap to call.

It imports the engine only.
"""
