"""``fxviews.export_onnx``: an ONNX model with every provable ``as_strided`` rewritten, checked.

Note [as_strided in ONNX]
-------------------------
ONNX tensors have values, not storage. The ONNX exporter lowers ``as_strided(x, S, T, O)`` to a
Gather of ``x`` flattened in row-major order at the indices ``O + sum(i * T)``, which is eager's
result only when ``x`` was contiguous from storage offset 0 when traced. On any other input (a
transpose, a slice) onnxruntime returns other elements, silently, or fails on indices out of
range. The export therefore goes:

1. ``torch.export.export`` with the caller's ``dynamic_shapes``: dims stay symbolic, so nothing
   sized by the example (a static trace's ``slice`` end) can reach the model;
2. :func:`fxviews.exporting.rewrite_exported`: decomposed, rewritten, validated;
3. ``torch.onnx.export`` of that program;
4. every ``as_strided`` left in the program the ONNX graph was translated from (kept by fxviews,
   or made by the ONNX decompositions) is checked: its input must be contiguous from offset 0
   for every value of the dynamic dims, and a concrete target must stay inside its input.
   Otherwise :class:`fxviews.FxViewsError` names the node: no silently wrong model.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx
from torch._prims_common import make_contiguous_strides_for
from torch.export import ExportedProgram

from fxviews.exporting import rewrite_exported
from fxviews.passes import FxViewsError, Geometry

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
    ``onnx_options`` go to ``torch.onnx.export`` (``dynamo=True`` is implied).

    Example::

        >>> onnx_program = fxviews.export_onnx(lambda x: x.t().as_strided((2, 3), (1, 2), 1),
        ...                                    (torch.randn(4, 2),))
        >>> onnx_program.save("windows.onnx")
    """
    program = _export(model, args, kwargs, dynamic_shapes)
    rewritten = rewrite_exported(program, strict=strict).exported_program
    onnx_options.setdefault("verbose", False)
    onnx_program = torch.onnx.export(rewritten, dynamo=True, **onnx_options)
    for node in onnx_program.exported_program.graph.nodes:
        if node.target is aten.as_strided.default:
            _check_onnx_exact(node)
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
    if isinstance(model, torch.fx.GraphModule) and dynamic_shapes is not None:
        # A traced graph holds the sizes of its example (slice ends, view shapes); exporting it
        # with dynamic dims would reuse them for every size, silently.
        raise FxViewsError(
            "a traced GraphModule has its example's sizes baked in and cannot be exported with "
            "dynamic_shapes; export the original module or function instead"
        )
    if not isinstance(model, torch.nn.Module):
        if not callable(model):
            raise TypeError(f"export_onnx expects a module or function, got {type(model)}")
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


def _check_onnx_exact(node: torch.fx.Node) -> None:
    """Raise unless ONNX's Gather lowering of this as_strided gives eager's values."""
    # Imported here: it loads sympy, which `import fxviews` does not need.
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    source, sizes, strides, *rest = node.args
    offset = rest[0] if rest else 0
    val = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor):
        raise FxViewsError(f"as_strided node {node.name!r} has no input metadata to check")
    expected = make_contiguous_strides_for(val.shape)
    contiguous = statically_known_true(val.storage_offset() == 0) and all(
        statically_known_true(size == 1) or statically_known_true(stride == want)
        for size, stride, want in zip(val.shape, val.stride(), expected)
    )
    if not contiguous:
        raise FxViewsError(
            f"as_strided node {node.name!r} stays in the program (see fxviews.rewrite's records) "
            f"and its input {source.name!r} is not provably contiguous from offset 0: ONNX's "
            "lowering would read other elements than eager"
        )
    values = (*sizes, *strides, offset, val.numel())
    if all(type(v) is int for v in values) and val.numel() > 0:
        low, high = Geometry(tuple(sizes), tuple(strides), offset).bounds()
        if low < 0 or high >= val.numel():
            raise FxViewsError(
                f"as_strided node {node.name!r} reads past its input {source.name!r}: ONNX "
                "cannot read memory outside a tensor"
            )
