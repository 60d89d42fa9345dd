"""TODO"""

import abc

import torch

from ..compat.torch_internals import PassBase
from ..graph_edits import collector_paused
from ..schema import Record, RecordedPassResult

__all__ = ["RecordingPass"]


class RecordingPass(PassBase):
    """A torch.fx pass whose result carries one :class:`Record` per node it handled.

    ``recompile=False`` leaves ``graph_module.recompile()`` to a caller that runs several passes
    and recompiles once, after the last.

    Example::

        >>> result = SomeRecordingPass(recompile=False)(gm); gm.recompile()
        >>> [r.method for r in result.records]
    """

    def __init__(self, recompile: bool = True) -> None:
        super().__init__()
        self.recompile = recompile

    def __call__(self, graph_module: torch.fx.GraphModule) -> RecordedPassResult:
        # Passes build many graph objects and free few: see Note [Graph edits and the cyclic
        # collector].
        with collector_paused():
            result = super().__call__(graph_module)
        if not isinstance(result, RecordedPassResult):  # a subclass's call broke the contract
            raise TypeError(f"{type(self).__name__}.call must return a RecordedPassResult")
        return result

    def finished(
        self, graph_module: torch.fx.GraphModule, records: list[Record]
    ) -> RecordedPassResult:
        """The result of a pass that rewrote the nodes ``records`` describe: the graph is linted
        and (if asked) recompiled where any was not kept."""
        modified = any(r.method != "kept" for r in records)
        if modified:
            graph_module.graph.lint()
            if self.recompile:
                graph_module.recompile()
        return RecordedPassResult(graph_module, modified, records)

    @abc.abstractmethod
    def call(self, graph_module: torch.fx.GraphModule) -> RecordedPassResult:
        """Run the pass on ``graph_module``: its result, with one record per node handled."""
