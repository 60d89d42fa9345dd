"""The models of the bench's "whole models" row: small ones written here (random init, no
downloads), each shaped like a family users run ``torch.func`` on, and the zoo that torchvision
and timm build (:mod:`fxviews.bench.zoo`, at an image side the bench's settings choose):

* ``vit``: a patch embedding and four pre-norm transformer blocks (LayerNorm, attention written
  out as timm does without fused attention, GELU MLP), a mean-pooled head.
* ``resnet``: torchvision's BasicBlock (conv, BatchNorm, in-place ReLU, ``out += identity``)
  in three stages, two of them strided with a projection shortcut.
* ``mobilenet``: a Hardswish stem and two MobileNetV2 inverted residuals (expand, depthwise,
  project, each with BatchNorm; ReLU6).
* ``encoder``: ``nn.TransformerEncoder`` (two layers, PyTorch's own attention) over 16 tokens.
* the zoo: ``resnet18`` and ``mobilenet_v3_small`` (torchvision), ``vit_tiny`` (timm's
  ``vit_tiny_patch16_224``).

BatchNorm runs in eval mode (running statistics), as in per-sample gradient training
(Opacus-style) and in forward-mode sensitivity analysis.

Each model gives two per-sample programs, run under ``vmap``: ``grads`` (the gradient of the
cross-entropy loss for each sample, through ``functional_call``) and ``jvp`` (the
Jacobian-vector product of the model's output in a direction of the input).

Example::

    >>> model = build("resnet")
    >>> fn, args = program("resnet", model, "grads", batch=8)
    >>> torch.func.vmap(fn)(*args)   # per-sample gradients of every parameter
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fxviews.bench import zoo
from fxviews.bench.zoo import CLASSES

__all__ = ["MODELS", "Model", "build", "program", "sample_shape"]

WIDTH = 32  # tokens' width in vit and encoder


class _Block(nn.Module):
    """A pre-norm ViT block: attention and an MLP, each behind a LayerNorm and a residual."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.heads, dim // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        scores = (q * (dim // self.heads) ** -0.5) @ k.transpose(-2, -1)
        mixed = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, tokens, dim)
        return self.proj(mixed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, depth: int = 4) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, WIDTH, 4, 4)
        self.blocks = nn.Sequential(*[_Block(WIDTH, 4) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.blocks(tokens)).mean(1))


class _BasicBlock(nn.Module):
    def __init__(self, channels: int, stride: int = 1) -> None:
        super().__init__()
        inputs = channels if stride == 1 else channels // 2
        self.conv1 = nn.Conv2d(inputs, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1:
            self.shortcut = nn.Sequential(
                nn.Conv2d(inputs, channels, 1, stride, bias=False), nn.BatchNorm2d(channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = self.shortcut(x)
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        out += identity
        return F.relu(out, inplace=True)


class ResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True)
        )
        self.stages = nn.Sequential(_BasicBlock(8), _BasicBlock(16, 2), _BasicBlock(32, 2))
        self.fc = nn.Linear(32, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.adaptive_avg_pool2d(self.stages(self.stem(x)), 1).flatten(1))


class _InvertedResidual(nn.Module):
    def __init__(self, channels: int, expand: int = 4) -> None:
        super().__init__()
        hidden = channels * expand
        self.block = nn.Sequential(
            nn.Conv2d(channels, hidden, 1, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, channels, 1, bias=False),
            nn.BatchNorm2d(channels),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class MobileNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish()
        )
        self.blocks = nn.Sequential(_InvertedResidual(16), _InvertedResidual(16))
        self.fc = nn.Linear(16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1).flatten(1))


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.position = nn.Parameter(torch.randn(16, WIDTH) * 0.02)
        layer = nn.TransformerEncoderLayer(WIDTH, 4, 2 * WIDTH, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x + self.position).mean(1))


@dataclass(frozen=True)
class Model:
    """A model of the row, its one-sample input shape, and the programs eager vmap runs.

    ``library`` is the library that builds a model of the zoo (None: written here); such a
    model's ``make`` takes the image side, and ``sample_shape`` holds its default one.
    """

    make: Callable[..., nn.Module]
    sample_shape: tuple[int, ...]
    programs: tuple[str, ...] = ("grads", "jvp")
    library: str | None = None


MODELS: dict[str, Model] = {
    "vit": Model(ViT, (3, 16, 16)),
    "resnet": Model(ResNet, (3, 16, 16)),
    "mobilenet": Model(MobileNet, (3, 16, 16)),
    # PyTorch's attention picks a fused CPU kernel without a forward-AD formula: no jvp.
    "encoder": Model(Encoder, (16, WIDTH), programs=("grads",)),
    "resnet18": Model(zoo.resnet18, (3, 224, 224), library="torchvision"),
    "mobilenet_v3_small": Model(zoo.mobilenet_v3_small, (3, 224, 224), library="torchvision"),
    "vit_tiny": Model(zoo.vit_tiny, (3, 224, 224), library="timm"),
}


def sample_shape(name: str, image_side: int | None = None) -> tuple[int, ...]:
    """One sample's input shape for model ``name``: a zoo model's images resized to
    ``image_side`` if given (the written models have one shape).

    Example::

        >>> sample_shape("resnet18", 112), sample_shape("resnet", 112)
        ((3, 112, 112), (3, 16, 16))
    """
    spec = MODELS[name]
    if spec.library is None or image_side is None:
        return spec.sample_shape
    return (*spec.sample_shape[:-2], image_side, image_side)


def build(name: str, seed: int = 0, image_side: int | None = None) -> nn.Module:
    """Model ``name`` with random parameters and running statistics, in eval mode (a zoo
    model for images of ``image_side``, default its own)."""
    torch.manual_seed(seed)
    spec = MODELS[name]
    model = spec.make(sample_shape(name, image_side)[-1]) if spec.library else spec.make()
    with torch.no_grad():
        for buffer in model.buffers():
            if buffer.is_floating_point():
                buffer.uniform_(0.5, 1.5)  # BatchNorm's statistics: not an identity
    return model.eval()


def program(
    name: str,
    model: nn.Module,
    kind: str,
    batch: int,
    image_side: int | None = None,
    device: str | None = None,
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """A new per-sample function ``kind`` of ``model`` (built by ``build(name, image_side=...)``
    and on ``device``, default CPU) and a batch of its arguments there.

    ``grads`` takes ``(x, label)`` and returns the loss's gradient for every parameter;
    ``jvp`` takes ``(x, direction)`` and returns the output and its tangent.
    """
    generator = torch.Generator().manual_seed(batch)
    shape = sample_shape(name, image_side)
    x = torch.randn(batch, *shape, generator=generator).to(device)
    if kind == "grads":
        params = {name: p.detach() for name, p in model.named_parameters()}
        buffers = dict(model.named_buffers())

        def loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            out = torch.func.functional_call(model, (p, buffers), (x.unsqueeze(0),))
            return F.cross_entropy(out, y.unsqueeze(0))

        def per_sample_grads(x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
            return torch.func.grad(loss)(params, x, y)

        labels = torch.randint(0, CLASSES, (batch,), generator=generator).to(device)
        return per_sample_grads, (x, labels)

    def push_forward(x: torch.Tensor, direction: torch.Tensor) -> Any:
        return torch.func.jvp(lambda a: model(a.unsqueeze(0)), (x,), (direction,))

    return push_forward, (x, torch.randn(batch, *shape, generator=generator).to(device))
