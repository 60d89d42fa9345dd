"""The systems fxviews hands rewritten programs to, a package or module each.

- :mod:`~fxviews.consumers.compile`: ``torch.compile(fn, backend="fxviews")``;
- :mod:`~fxviews.consumers.export`: ``torch.export`` programs (``fxviews.rewrite(ep)``),
  ``fxviews.export_onnx`` and ``fxviews.executorch`` (ExecuTorch's ``to_edge`` and
  ``to_edge_transform_and_lower``, imported on first use);
- :mod:`~fxviews.consumers.dtensor`: ``fxviews.dtensor.register()``, DTensor answers
  ``as_strided`` with the proven view chain (imported on first use). It drives the engine at
  run time (:mod:`fxviews.passes.runtime.runtime_views`), not on graphs.

Each takes a program from its system and gives it back rewritten, through the stages below
(:mod:`fxviews.rewriting`, and the tracing lock and thread state of :mod:`fxviews.tracing`);
none imports the public API (:mod:`fxviews.apis`) back.
"""
