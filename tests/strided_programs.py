"""Programs with strided views, exported and run by the deployment-runtime tests.

Each is a small ``torch.nn.Module`` whose exported program reads memory through an
``as_strided`` (or an ``unfold``) in a way some runtime lowers as if its input were contiguous:
windows of an input, of a transposed product, of a slice; Longformer's chunks over a transposed
head layout; the tangent of forward AD over an in-place write; stft frames (taken by
``as_strided``, and by ``torch.stft`` itself); patches of an NHWC image; and a control without
any. ``tests/test_executorch.py`` and ``tests/test_runtimes.py`` share them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from fxviews.examples import push_jvp


class InputWindows(torch.nn.Module):
    """Overlapping windows of 3 over the input itself, then a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 4)

    def forward(self, x):
        return self.linear(x.as_strided((6, 3), (1, 1)))


class TransposedWindows(torch.nn.Module):
    """The same windows over a transposed product: they walk its first column."""

    def forward(self, x, w):
        return (x @ w).t().as_strided((6, 3), (1, 1)) * 2


class SlicedWindow(torch.nn.Module):
    """A window on a column slice (storage offset 1, row stride 4)."""

    def forward(self, x):
        return x[:, 1:].as_strided((3, 2), (4, 1), 1) + 1


class OffsetWindows(torch.nn.Module):
    """Windows of 4, step 2, over an intermediate that starts at storage offset 1."""

    def forward(self, x):
        y = (x * 2)[1:]
        return y.as_strided((3, 4), (2, 1), 1).sum(-1)


def longformer_chunk(hidden: torch.Tensor, window: int) -> torch.Tensor:
    """Overlapping chunks of ``2 * window`` rows, ``window`` apart (Longformer's geometry):
    split the sequence into chunks of ``2 * window``, then halve the chunk stride."""
    heads, length, dim = hidden.shape
    chunks = hidden.view(heads, length // (2 * window), 2 * window, dim)
    sizes = [heads, 2 * chunks.size(1) - 1, 2 * window, dim]
    strides = [chunks.stride(0), chunks.stride(1) // 2, chunks.stride(2), chunks.stride(3)]
    return chunks.as_strided(sizes, strides)


class LongformerScores(torch.nn.Module):
    """Sliding-chunk attention scores: queries and keys of (batch, length, heads, dim) put in a
    (batch * heads, length, dim) head layout, chunked, multiplied chunk by chunk."""

    def forward(self, query, key):
        batch, length, heads, dim = query.shape

        def heads_first(t: torch.Tensor) -> torch.Tensor:
            return t.transpose(1, 2).reshape(batch * heads, length, dim)

        q, k = (longformer_chunk(heads_first(t), 2) for t in (query, key))
        return torch.einsum("bcxd,bcyd->bcxy", q, k)


class StftFeatures(torch.nn.Module):
    """Log power spectrum of one channel of a (time, channel) signal: frames taken the way
    ``torch.stft`` takes them (strides scaled by the signal's), a Hann window, a real DFT."""

    def __init__(self, n_fft: int = 8, hop: int = 2) -> None:
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        k = torch.arange(n_fft // 2 + 1, dtype=torch.float32)
        t = torch.arange(n_fft, dtype=torch.float32)
        angle = 2 * torch.pi * t[:, None] * k[None, :] / n_fft
        self.register_buffer("cos", torch.cos(angle))
        self.register_buffer("sin", torch.sin(angle))
        self.register_buffer("window", torch.hann_window(n_fft))

    def forward(self, x):
        signal = x[:, 1]
        step = signal.stride(0)
        count = (signal.size(0) - self.n_fft) // self.hop + 1
        frames = signal.as_strided(
            (count, self.n_fft), (self.hop * step, step), signal.storage_offset()
        )
        frames = frames * self.window
        power = (frames @ self.cos) ** 2 + (frames @ self.sin) ** 2
        return torch.log(power + 1e-6)


class TorchStft(torch.nn.Module):
    """Power spectrum by ``torch.stft`` of one channel of a (time, channel) signal: a strided
    column, framed by stft itself (``unfold`` once decomposed to core ATen), windowed, FFT'd."""

    def __init__(self, n_fft: int = 8, hop: int = 2) -> None:
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.register_buffer("window", torch.hann_window(n_fft))

    def forward(self, x):
        spectrum = torch.stft(
            x[:, 1], self.n_fft, self.hop, window=self.window, center=False, return_complex=True
        )
        return torch.view_as_real(spectrum).pow(2).sum(-1)


class PushJvp(torch.nn.Module):
    """Forward AD over an in-place write to a viewed base (the README's push_jvp)."""

    def forward(self, x, y, yt):
        return push_jvp(x, y, yt)


def _write_over_column(x, y):
    x = x.clone()
    column = x[:, 1]
    x.copy_(y)  # forward AD hands `column` its tangent through as_strided (stride 5, offset 1)
    return column * 2, x


class ColumnJvp(torch.nn.Module):
    """push_jvp's pattern with a column view of the overwritten base."""

    def forward(self, x, y, yt):
        return torch.func.jvp(functools.partial(_write_over_column, x), (y,), (yt,))


class ConvLinear(torch.nn.Module):
    """The control: conv + linear, no as_strided anywhere."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.linear = torch.nn.Linear(36, 5)

    def forward(self, x):
        return self.linear(self.conv(x).relu().flatten(1))


class NhwcPatches(torch.nn.Module):
    """4x4 patches of an NHWC view of an image, by the model's own ``unfold``, then a Linear
    (a vision transformer's patch embedding written with windows)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(48, 5)

    def forward(self, image):
        nhwc = image.permute(0, 2, 3, 1)
        patches = nhwc.unfold(1, 4, 4).unfold(2, 4, 4)  # (n, rows, columns, c, 4, 4)
        return self.linear(patches.reshape(patches.shape[0], -1, 48))


def sample(shapes: tuple[tuple[int, ...], ...], seed: int) -> tuple[torch.Tensor, ...]:
    """Inputs of ``shapes`` drawn from ``seed`` (0: the example a test exports with)."""
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=gen) for shape in shapes)


@functools.cache
def built(make: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """The module ``make`` builds, in eval mode, its parameters drawn from seed 0: one per
    factory, shared by a file's tests."""
    torch.manual_seed(0)
    return make().eval()
