"""Research programs that write their own as_strided: the compile backend's vmap tests, and
row 11 of the bench.

Each takes one sample (no batch dim) and reads it with strides written for a contiguous sample,
as such code is written: im2col convolution, log-mel framing, Hankel and Takens delay
embeddings, and sliding windows. Under ``torch.func.vmap`` with the batch dim anywhere but first
in memory, eager PyTorch's as_strided rule reads each sample's physical layout instead.

Example::

    >>> fn, shape = PROGRAMS["hankel"]
    >>> fn(torch.randn(*shape)).shape
    torch.Size([7, 4])
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_generator = torch.Generator().manual_seed(0)
#: The convolution's weights and the mel filter bank: closed-over constants, as in a model.
CONV_WEIGHT = torch.randn(5, 2, 3, 3, generator=_generator)
MEL_FILTERS = torch.rand(9, 5, generator=_generator)


def im2col_conv(x: torch.Tensor) -> torch.Tensor:
    """A 3x3 convolution of a ``(channels, height, width)`` image by im2col patches."""
    channels, height, width = x.shape
    patches = x.as_strided(
        (channels, 3, 3, height - 2, width - 2), (height * width, width, 1, width, 1)
    )
    return torch.einsum("ckluv,ockl->ouv", patches, CONV_WEIGHT)


def log_mel(x: torch.Tensor) -> torch.Tensor:
    """Log-mel energies of a 1-D signal: hann-windowed frames of 16 every 8 samples."""
    frame, hop = 16, 8
    frames = x.as_strided(((x.shape[0] - frame) // hop + 1, frame), (hop, 1))
    power = torch.fft.rfft(frames * torch.hann_window(frame)).abs() ** 2
    return torch.log(power @ MEL_FILTERS + 1e-3)


def hankel(x: torch.Tensor) -> torch.Tensor:
    """The Hankel matrix of a 1-D series with 4 columns."""
    return x.as_strided((x.shape[0] - 3, 4), (1, 1))


def takens(x: torch.Tensor) -> torch.Tensor:
    """Takens' delay embedding of a 1-D series: dimension 3, delay 2."""
    return x.as_strided((x.shape[0] - 4, 3), (1, 2))


def windows(x: torch.Tensor) -> torch.Tensor:
    """Overlapping windows of 3 (the README's example)."""
    return x.as_strided((x.numel() - 2, 3), (1, 1))


#: name -> (program, the shape of one sample in the tests).
PROGRAMS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], tuple[int, ...]]] = {
    "im2col": (im2col_conv, (2, 6, 7)),
    "log_mel": (log_mel, (40,)),
    "hankel": (hankel, (10,)),
    "takens": (takens, (11,)),
    "windows": (windows, (8,)),
}


def squared_sum(
    fn: Callable[[torch.Tensor], torch.Tensor],
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A scalar loss of ``fn``'s output, for ``grad``."""
    return lambda x: (fn(x) ** 2).sum()


#: The shape of one sample in the bench (row 11): long enough to time.
BENCH_SHAPES: dict[str, tuple[int, ...]] = {
    "im2col": (2, 32, 32),
    "log_mel": (4096,),
    "hankel": (1024,),
    "takens": (1024,),
    "windows": (1024,),
}
#: How row 11 applies ``vmap`` to a program: to it, or to its loss's gradient.
KINDS = ("vmap", "vmap(grad)")


def per_sample(name: str, kind: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """Program ``name`` as ``kind`` applies vmap to it: itself, or its loss's gradient.

    Example::

        >>> per_sample("hankel", "vmap(grad)")(torch.randn(10)).shape
        torch.Size([10])
    """
    fn = PROGRAMS[name][0]
    return torch.func.grad(squared_sum(fn)) if kind == "vmap(grad)" else fn
