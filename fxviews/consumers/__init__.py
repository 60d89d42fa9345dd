"""The systems fxviews hands rewritten programs to, a module each.

- :mod:`~fxviews.consumers.compile_backend`: ``torch.compile(fn, backend="fxviews")``;
- :mod:`~fxviews.consumers.export`: ``torch.export`` programs (``fxviews.rewrite(ep)``);
- :mod:`~fxviews.consumers.onnx`: ``fxviews.export_onnx``;
- :mod:`~fxviews.consumers.executorch`: ``fxviews.executorch.to_edge`` and
  ``to_edge_transform_and_lower`` (ExecuTorch's, imported on first use);
- :mod:`~fxviews.consumers.flat_reads`: the check ONNX and ExecuTorch share for a kept
  ``as_strided``, which both run as a read of a dense tensor;
- :mod:`~fxviews.consumers.dtensor`: ``fxviews.dtensor.register()``, DTensor answers
  ``as_strided`` with the proven view chain (imported on first use). It drives the engine at
  run time (:mod:`fxviews.passes.runtime_views`), not on graphs.

Each imports the front door's engine drivers (:mod:`fxviews.graph_rewriting`) and never the
front door's public modules back, so no import circle runs through a consumer.
"""
