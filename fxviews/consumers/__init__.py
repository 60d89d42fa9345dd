"""The systems fxviews hands rewritten programs to, a module each.

- :mod:`~fxviews.consumers.compile_backend`: ``torch.compile(fn, backend="fxviews")``;
- :mod:`~fxviews.consumers.export`: ``torch.export`` programs (``fxviews.rewrite(ep)``);
- :mod:`~fxviews.consumers.onnx`: ``fxviews.export_onnx``.

Each imports the front door's engine drivers (:mod:`fxviews.graph_rewriting`) and never the
front door's public modules back, so no import circle runs through a consumer.
"""
