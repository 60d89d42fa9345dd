"""Calls: ``transform``'s cache and the hot call, the build of an entry, and the graph's code.

Takes a user's function and each call's arguments; gives the call's result, from a cached
graph whose guard passes, or from a new entry built for the call's signature (trace, rewrite,
guard: Note [Building a cache entry] in :mod:`.build`), or from ``fn`` itself where it cannot
be one graph. :mod:`.cache` holds the cache and the hot call (Note [The cached call]),
:mod:`.keys` what of a call selects a graph, :mod:`.graph_code` the Python code of a graph only
fxviews runs, and :mod:`.rebuilding` the function's output tree from the graph's outputs.

It drives the stages below it (tracing, state, rewriting); only the API above imports it.
"""
