"""``fxviews.export_onnx``: an ONNX model with every provable ``as_strided`` rewritten, checked.

Note [as_strided in ONNX]
-------------------------
ONNX tensors have values, not storage. The ONNX exporter lowers ``as_strided(x, S, T, O)`` to a
Gather of ``x`` flattened in row-major order at the indices ``O + sum(i * T)``, which is eager's
result only when ``x`` was contiguous from storage offset 0 when traced. On any other input (a
transpose, a slice) onnxruntime returns other elements, silently, or fails on indices out of
range. It has no lowering for ``as_strided_scatter``. The export therefore goes:

1. ``torch.export.export`` with the caller's ``dynamic_shapes``: dims stay symbolic, so nothing
   sized by the example (a static trace's ``slice`` end) can reach the model;
2. :func:`fxviews.consumers.export.program.rewrite_exported`: decomposed, rewritten, validated;
3. ``torch.onnx.export`` of that program, with ``as_strided_scatter`` (which fxviews keeps where
   its region has no scatter form) translated the way ONNX translates ``as_strided``: a
   ScatterND into ``self`` flattened, at the target's addresses;
4. every ``as_strided`` and ``as_strided_scatter`` left in the program the ONNX graph was
   translated from is checked: its input must be contiguous from offset 0 for every value of
   the dynamic dims, and a concrete target must stay inside it (and, for a scatter, not write
   an element twice). Otherwise :class:`fxviews.FxViewsError` names the node: no silently
   wrong model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from torch.export import ExportedProgram

from fxviews.consumers.export.flat_reads import check_flat_read
from fxviews.consumers.export.program import rewrite_exported
from fxviews.passes import FxViewsError, Geometry
from fxviews.passes.graph_edits import pytree_spec_copies

__all__ = ["export_onnx"]

aten = torch.ops.aten


class _Function(torch.nn.Module):
    """A plain function as a module, for ``torch.export.export``."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def export_onnx(
    model: torch.nn.Module | ExportedProgram | Callable[..., Any],
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    dynamic_shapes: Any = None,
    strict: bool = False,
    **onnx_options: Any,
) -> Any:
    """Export ``model`` to ONNX with its ``as_strided`` rewritten; a ``torch.onnx.ONNXProgram``.

    ``model`` is a module, a function or an ``ExportedProgram`` (then ``args``, ``kwargs`` and
    ``dynamic_shapes`` are its own already). ``strict=True`` raises
    :class:`fxviews.UnsafeAsStridedError` for any as_strided fxviews has to keep; without it,
    a kept one whose ONNX lowering would differ from eager raises :class:`fxviews.FxViewsError`.
    ``onnx_options`` go to ``torch.onnx.export`` (``dynamo=True`` is implied; a
    ``custom_translation_table`` is merged with the one for ``as_strided_scatter``).

    Example::

        >>> onnx_program = fxviews.export_onnx(lambda x: x.t().as_strided((2, 3), (1, 2), 1),
        ...                                    (torch.randn(4, 2),))
        >>> onnx_program.save("windows.onnx")
    """
    program = _export(model, args, kwargs, dynamic_shapes)
    rewritten = rewrite_exported(program, strict=strict, inference=True).exported_program
    onnx_options.setdefault("verbose", False)
    table = onnx_options.pop("custom_translation_table", None) or {}
    table = {aten.as_strided_scatter.default: _as_strided_scatter_onnx, **table}
    with pytree_spec_copies():  # the exporter decomposes the program, copying pytree specs
        onnx_program = torch.onnx.export(
            rewritten, dynamo=True, custom_translation_table=table, **onnx_options
        )
    translated = None if onnx_program is None else onnx_program.exported_program
    if translated is None:  # dynamo=True always returns a program that keeps it
        raise FxViewsError("torch.onnx.export returned no exported program to check")
    for node in translated.graph.nodes:
        if node.target in (aten.as_strided.default, aten.as_strided_scatter.default):
            check_flat_read(node, "ONNX")
    return onnx_program


def _export(
    model: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None, dynamic_shapes: Any
) -> ExportedProgram:
    if isinstance(model, ExportedProgram):
        if args or kwargs or dynamic_shapes is not None:
            raise ValueError(
                "an ExportedProgram has its inputs and dynamic shapes already; pass it alone"
            )
        return model
    if dynamic_shapes is not None and _traced_on_an_example(model):
        # Such a graph holds the sizes of its example (slice ends, view shapes); exporting it
        # with dynamic dims would reuse them for every size, silently.
        raise FxViewsError(
            "a traced GraphModule has its example's sizes baked in and cannot be exported with "
            "dynamic_shapes; export the original module or function instead"
        )
    if not isinstance(model, torch.nn.Module):
        if not callable(model):
            raise TypeError(f"export_onnx expects a module or function, got {type(model).__name__}")
        model = _Function(model)
        if dynamic_shapes is not None:
            # The wrapper takes *args: its one parameter holds the per-argument specs.
            if not isinstance(dynamic_shapes, (tuple, list)) or kwargs:
                raise ValueError(
                    "for a function, dynamic_shapes is one entry per positional argument (no "
                    "kwargs); wrap it in a torch.nn.Module for anything else"
                )
            dynamic_shapes = (tuple(dynamic_shapes),)
    return torch.export.export(model, tuple(args), kwargs, dynamic_shapes=dynamic_shapes)


def _traced_on_an_example(model: Any) -> bool:
    """A GraphModule traced on example tensors (make_fx, fxviews.trace): concrete shapes."""
    if not isinstance(model, torch.fx.GraphModule):
        return False
    values = [node.meta.get("val") for node in model.graph.find_nodes(op="placeholder")]
    return any(isinstance(v, torch.Tensor) and all(type(d) is int for d in v.shape) for v in values)


def _as_strided_scatter_onnx(
    self: Any, src: Any, size: list[int], stride: list[int], storage_offset: int | None = 0
) -> Any:
    """ONNX Script translation: ``src`` scattered into ``self`` flattened (see the Note)."""
    import numpy as np
    import onnx_ir as ir
    from onnxscript import opset18 as op

    addresses = Geometry(tuple(size), tuple(stride), storage_offset or 0).addresses()
    indices = np.fromiter(addresses, dtype=np.int64).reshape(-1, 1)
    # Any: onnxscript's opset stubs type each value by its ONNX dtype and want onnx's own
    # TensorProto, where a translation function builds values at export time from onnx_ir.
    flat: Any = op.Constant(value_ints=[-1])
    tensor: Any = ir.tensor(indices)
    where: Any = op.Constant(value=tensor)
    scattered = op.ScatterND(op.Reshape(self, flat), where, op.Reshape(src, flat))
    return op.Reshape(scattered, op.Shape(self))
