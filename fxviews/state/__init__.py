"""State: what a cached graph is guarded on, and the world around a function it must follow.

Takes a function (what it reaches: :mod:`.reachable`), a traced graph (which held tensors'
layouts and which arguments' offsets it depends on: :mod:`.layouts`) and the Python state a
trace ran in (:mod:`.python_state`: attributes, globals, cells, containers and random streams a
trace rebinds or writes, put back and refused); gives a :class:`~.guard.StateGuard`, made once
a trace is done, that says on every call whether eager PyTorch would read what the trace read
(Note [The state a graph bakes in] in :mod:`.guard`).

It imports the engine's schema and compat layer only: the stages above ask it, it asks none.
"""
