"""The bench's zoo: whole models built by torchvision and timm, for the "whole models" row.

Written by others, so fxviews meets them as users do: torchvision's ``resnet18`` (BasicBlocks,
in-place ReLU, ``out += identity``) and ``mobilenet_v3_small`` (inverted residuals, squeeze-
and-excitation, in-place Hardswish), and timm's ``vit_tiny_patch16_224`` (12 pre-norm blocks
of 3 heads, a class token). Random init, 10 classes, nothing downloaded, at any image side.
The libraries are the optional extra ``fxviews[zoo]`` and are imported only when a model is
built; :func:`unavailable` says why one cannot be, so the row prints ``n/a (reason)`` instead.

timm's attention runs written out (``fused_attn = False``, its own fallback path), as the
written ViT of :mod:`fxviews.bench.models` does: PyTorch's fused CPU attention kernel has no
forward-AD formula, so ``jvp`` through it fails in eager PyTorch too.

Example::

    >>> unavailable("torchvision") or resnet18(112)(torch.randn(1, 3, 112, 112)).shape
    torch.Size([1, 10])
"""

from __future__ import annotations

import functools
import importlib

from torch import nn

from fxviews.tracing.failures import first_line

__all__ = ["CLASSES", "mobilenet_v3_small", "resnet18", "unavailable", "vit_tiny"]

CLASSES = 10


@functools.cache
def unavailable(library: str) -> str | None:
    """Why ``library`` cannot build models here (None if it can), as the row prints it.

    Example::

        >>> unavailable("no_such_library")
        'no_such_library not installed'
    """
    try:
        importlib.import_module(library)
    except ImportError:
        return f"{library} not installed"
    except Exception as err:  # noqa: BLE001 - an install that fails to import is stated, not fatal
        # e.g. a torchvision wheel built for another torch: its C ops fail to load, and
        # torchvision 0.28 then raises registering fake kernels for them.
        return f"{library} does not import: {type(err).__name__}: {first_line(err)}"[:90]
    return None


def resnet18(image_side: int) -> nn.Module:
    """torchvision's ResNet-18 (works at any image side of 32 or more)."""
    from torchvision import models

    del image_side  # global average pooling: the network takes any size
    return models.resnet18(weights=None, num_classes=CLASSES)


def mobilenet_v3_small(image_side: int) -> nn.Module:
    """torchvision's MobileNetV3-Small (any image side of 32 or more)."""
    from torchvision import models

    del image_side
    return models.mobilenet_v3_small(weights=None, num_classes=CLASSES)


def vit_tiny(image_side: int) -> nn.Module:
    """timm's ``vit_tiny_patch16_224`` for images of ``image_side`` (a multiple of 16), its
    attention written out."""
    import timm

    model = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, num_classes=CLASSES, img_size=image_side
    )
    for module in model.modules():
        if hasattr(module, "fused_attn"):
            # setattr: nn.Module's typed __setattr__ takes only tensors and modules.
            setattr(module, "fused_attn", False)  # noqa: B010
    return model
