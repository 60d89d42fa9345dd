"""Tracing: a user's function captured as an aten graph, wherever eager runs it.

Takes a callable and example arguments (or, for ``transform``, a call's arguments: Note [The
layout of a call] in :mod:`.samples`); gives a ``torch.fx.GraphModule`` whose ``meta`` says
how it was traced (:data:`fxviews.passes.schema.TRACED_WITH`) and what of the function's
autograd structure it kept, or a :class:`~.failures.TracingError` naming why the function is not
one graph. Note [One tracing path] in :mod:`.capture` is the map; each module is one part:

- :mod:`.capture`: ``fxviews.trace`` and :func:`~.capture.capture`, the one path every trace
  takes (a recording, fake mode, real mode where fake mode falls short);
- :mod:`.recording`: one sample's ops recorded on real values, ``transform``'s fast trace;
  :mod:`.composite_calls` (``linear``, ``matmul``, ``dropout`` recorded whole),
  :mod:`.tensor_indices` (a 0-d tensor index as a gather), :mod:`.layout_decisions`
  (``reshape`` and its kin kept deciding at run time), :mod:`.scalar_values` (``.item()``
  values kept as tensors);
- :mod:`.autograd`: what autograd sees is part of the trace (grad-mode regions and custom
  Functions kept, the rest refused);
- :mod:`.modes`: modes ``fn`` enters inside its body (autocast kept as its casts, the default
  dtype and process settings ops read as they run checked at each op);
- :mod:`.trace_guard`: what a trace writes outside its own tensors is undone, values it must
  not bake in refused; :mod:`.torch_state`: PyTorch's thread state put back after a trace;
- :mod:`.samples`: the tensors a trace runs on, from the layout a call brings;
- :mod:`.failures` (what went wrong, in the user's terms) and :mod:`.classification` (which
  kind of failure: the function's nature, fxviews' limit, or the user's own error);
- :mod:`.lock`: the process-wide tracing lock.

It reads the state :mod:`fxviews.state` finds (the objects a function reaches, to fork their
generators) and the engine's schema; it imports nothing of the stages above it.
"""
