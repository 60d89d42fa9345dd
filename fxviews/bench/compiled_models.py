"""Whole models compiled with ``torch.compile``: the bench's "compiled models" row and the
backend's whole-model tests.

Each is written in the style of the real model it stands for (random init, no downloads),
the ``as_strided`` calls included where the real code makes them:

* ``longformer``: two layers of sliding-chunk self attention as HF Longformer writes it:
  the query scaled in place (``query /= sqrt(d)``), overlapping chunks made by ``_chunk``
  (``view``, strides read with ``.stride()``, ``as_strided``), scores on the diagonals
  written into a buffer through slices, values chunked by ``as_strided`` of the padded
  values with a chunk count computed by ``torch.div``.
* ``chunked_cache``: keys projected into a buffer padded by one window (a decode step's
  cache) and read back as Longformer-style chunks reaching into the padding: an
  ``as_strided`` the engine keeps, over memory written in place just before.
* ``windowed_gain``: a learned gain multiplied in place into windows of 4 features every 7
  (``unfold`` with gaps no slice of the 32 features makes), between two linear layers: a
  write functionalization inverts wrongly, which runs alone as eager PyTorch.
* ``toeplitz``: a layer whose weight is a Toeplitz matrix made from its diagonals by
  ``as_strided`` (structured linear layers, long convolutions), between two linear layers.
* ``im2col``: a convolution written as im2col patches (``as_strided`` with the strides of the
  input, then ``einsum``), twice, with a ReLU between.
* ``gpt2``: two GPT-2 blocks (``Conv1D`` projections by ``addmm``, heads split by ``view`` and
  ``permute``, a causal mask buffer, ``gelu``): no ``as_strided``, the control.

Example::

    >>> model, make_input = build("longformer")
    >>> model(make_input(batch=2)).shape
    torch.Size([2, 16, 32])
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["COMPILED_MODELS", "CompiledModel", "build", "chunk", "sliding_chunk_scores"]

WIDTH = 32  # the tokens' width of longformer and gpt2
TOKENS = 16  # a sequence's tokens (a multiple of longformer's window)


def chunk(hidden: torch.Tensor, window: int) -> torch.Tensor:
    """HF Longformer's ``_chunk``: ``(rows, tokens, dim)`` as overlapping chunks of ``2 *
    window`` tokens every ``window``, made with the strides the tensor reports.

    Sizes are computed as Longformer computes them, with ``torch.div`` of Python ints: a
    0-dim tensor used as a size (what its type hints do not allow, hence the ignores)."""
    hidden = hidden.view(  # type: ignore[call-overload]
        hidden.size(0),
        torch.div(hidden.size(1), window * 2, rounding_mode="trunc"),
        window * 2,
        hidden.size(2),
    )
    size = list(hidden.size())
    size[1] = size[1] * 2 - 1
    stride = list(hidden.stride())
    stride[1] = stride[1] // 2
    return hidden.as_strided(size=size, stride=stride)


def sliding_chunk_scores(query: torch.Tensor, key: torch.Tensor, window: int) -> torch.Tensor:
    """Query-key products of every pair of tokens at most ``window`` apart in a chunk pair,
    as Longformer's ``_sliding_chunks_query_key_matmul`` makes them (``(heads, tokens, dim)``
    each, one sample)."""
    return torch.einsum("bcxd,bcyd->bcxy", chunk(query, window), chunk(key, window))


class SlidingChunkAttention(nn.Module):
    """Longformer's self attention over a local window (no global tokens)."""

    def __init__(self, width: int = WIDTH, heads: int = 2, window: int = 4) -> None:
        super().__init__()
        self.heads, self.head_dim, self.window = heads, width // heads, window // 2
        self.query, self.key, self.value = (nn.Linear(width, width) for _ in range(3))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden.transpose(0, 1)
        query, key, value = self.query(hidden), self.key(hidden), self.value(hidden)
        tokens, batch, width = hidden.size()
        query /= math.sqrt(self.head_dim)
        query = query.view(tokens, batch, self.heads, self.head_dim).transpose(0, 1)
        key = key.view(tokens, batch, self.heads, self.head_dim).transpose(0, 1)
        scores = self._diagonal_scores(query, key)
        probs = scores.softmax(-1)
        value = value.view(tokens, batch, self.heads, self.head_dim).transpose(0, 1)
        out = self._probs_times_values(probs, value)
        return out.reshape(batch, tokens, width)

    def _grouped(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, heads, dim = x.size()
        return x.transpose(1, 2).reshape(batch * heads, tokens, dim)

    def _diagonal_scores(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        w = self.window
        batch, tokens, heads, _ = query.size()
        chunks = torch.div(tokens, w, rounding_mode="trunc") - 1
        scores = sliding_chunk_scores(self._grouped(query), self._grouped(key), w)
        scores = F.pad(scores, (0, 0, 0, 1))
        scores = scores.view(*scores.size()[:-2], scores.size(-1), scores.size(-2))
        diagonal = scores.new_zeros((batch * heads, chunks + 1, w, w * 2 + 1))  # type: ignore[arg-type]
        diagonal[:, :-1, :, w:] = scores[:, :, :w, : w + 1]
        diagonal[:, -1, :, w:] = scores[:, -1, w:, : w + 1]
        diagonal[:, 1:, :, :w] = scores[:, :, -(w + 1) : -1, w + 1 :]
        diagonal[:, 0, 1:w, 1:w] = scores[:, 0, : w - 1, 1 - w :]
        return diagonal.view(batch, heads, tokens, 2 * w + 1).transpose(2, 1)

    def _probs_times_values(self, probs: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        w = self.window
        batch, tokens, heads, dim = value.size()
        chunks = torch.div(tokens, w, rounding_mode="trunc") - 1
        probs = probs.transpose(1, 2).reshape(  # type: ignore[call-overload]
            batch * heads, torch.div(tokens, w, rounding_mode="trunc"), w, 2 * w + 1
        )
        padded = F.pad(self._grouped(value), (0, 0, w, w), value=-1)
        stride = padded.stride()
        chunked = padded.as_strided(
            size=(batch * heads, chunks + 1, 3 * w, dim),  # type: ignore[arg-type]
            stride=(stride[0], w * stride[1], stride[1], stride[2]),
        )
        # Longformer's _pad_and_diagonalize: each row shifted one further right.
        probs = F.pad(probs, (0, w + 1)).view(batch * heads, chunks + 1, -1)[:, :, :-w]  # type: ignore[call-overload]
        probs = probs.view(batch * heads, chunks + 1, w, 3 * w + 1)[:, :, :, :-1]  # type: ignore[call-overload]
        out = torch.einsum("bcwd,bcdh->bcwh", (probs, chunked))
        return out.view(batch, heads, tokens, dim).transpose(1, 2)


class _LongformerLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = SlidingChunkAttention()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH)
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = self.norm1(hidden + self.attention(hidden))
        return self.norm2(hidden + self.mlp(hidden))


class Longformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(_LongformerLayer(), _LongformerLayer())

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.layers(hidden)


class ChunkedCache(nn.Module):
    """Keys projected into a buffer padded by one window (a decode step's key cache), read back
    by Longformer-style overlapping chunks whose last one reaches into the padding: an
    ``as_strided`` no view op of the filled rows expresses, over memory just written."""

    def __init__(self, width: int = WIDTH, window: int = 2) -> None:
        super().__init__()
        self.window = window
        self.key, self.out = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = hidden.shape
        w = self.window
        cache = hidden.new_zeros(batch, tokens + w, width)
        cache[:, :tokens] = self.key(hidden)
        filled = cache[:, :tokens]
        stride = filled.stride()
        chunks = filled.as_strided(
            (batch, tokens // w, 2 * w, width), (stride[0], w * stride[1], stride[1], stride[2])
        )
        mixed = (chunks.softmax(2) * chunks).sum(2)
        return self.out(mixed.repeat_interleave(w, 1))


class WindowedGain(nn.Module):
    """``linear -> windows of 4 features every 7 scaled in place -> tanh -> linear``: the gain
    applies to the windows only, the features between them pass unchanged."""

    def __init__(self, width: int = WIDTH, size: int = 4, step: int = 7) -> None:
        super().__init__()
        self.size, self.step = size, step
        self.gain = nn.Parameter(1 + torch.randn((width - size) // step + 1, size) / 4)
        self.inner, self.outer = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        mixed = self.inner(hidden)
        mixed.unfold(-1, self.size, self.step).mul_(self.gain)
        return self.outer(torch.tanh(mixed))


class Toeplitz(nn.Module):
    """``linear -> x @ T -> linear``, ``T[i, j] = diagonals[n - 1 - i + j]`` made by
    ``as_strided`` over the flipped diagonals (a Hankel view, flipped back)."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.width = width
        self.diagonals = nn.Parameter(torch.randn(2 * width - 1) / width)
        self.inner, self.outer = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.width
        hankel = self.diagonals.flip(0).as_strided((n, n), (1, 1))
        return self.outer(torch.relu(self.inner(x) @ hankel.flip(0)))


class Im2colConv(nn.Module):
    """Two 3x3 convolutions written as im2col patches of the input's own strides."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.first = nn.Parameter(torch.randn(channels, 3, 3, 3) / 5)
        self.second = nn.Parameter(torch.randn(channels, channels, 3, 3) / 10)

    @staticmethod
    def _conv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = x.shape
        sb, sc, sh, sw = x.stride()
        patches = x.as_strided(
            (batch, channels, 3, 3, height - 2, width - 2), (sb, sc, sh, sw, sh, sw)
        )
        return torch.einsum("bckluv,ockl->bouv", patches, weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv(torch.relu(self._conv(x, self.first)), self.second)


class _GPT2Block(nn.Module):
    def __init__(self, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        # GPT-2's Conv1D: a weight of (in, out) applied by addmm.
        self.c_attn = nn.Parameter(torch.randn(WIDTH, 3 * WIDTH) * 0.02)
        self.c_proj = nn.Parameter(torch.randn(WIDTH, WIDTH) * 0.02)
        self.c_fc = nn.Parameter(torch.randn(WIDTH, 4 * WIDTH) * 0.02)
        self.c_out = nn.Parameter(torch.randn(4 * WIDTH, WIDTH) * 0.02)
        self.bias = nn.Parameter(torch.zeros(3 * WIDTH))
        mask = torch.tril(torch.ones(TOKENS, TOKENS, dtype=torch.bool))
        self.mask: torch.Tensor
        self.register_buffer("mask", mask.view(1, 1, TOKENS, TOKENS))

    @staticmethod
    def _conv1d(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        out = (
            x.view(-1, x.size(-1)) @ weight
            if bias is None
            else torch.addmm(bias, x.view(-1, x.size(-1)), weight)
        )
        return out.view(*x.size()[:-1], weight.size(-1))

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.size()[:-1], self.heads, -1).permute(0, 2, 1, 3)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        query, key, value = self._conv1d(self.ln_1(hidden), self.c_attn, self.bias).split(WIDTH, 2)
        query, key, value = map(self._split_heads, (query, key, value))
        scores = query @ key.transpose(-1, -2) / math.sqrt(value.size(-1))
        tokens = scores.size(-1)
        scores = scores.masked_fill(
            ~self.mask[:, :, :tokens, :tokens], torch.finfo(scores.dtype).min
        )
        mixed = (scores.softmax(-1) @ value).permute(0, 2, 1, 3).contiguous()
        hidden = hidden + self._conv1d(mixed.view(*mixed.size()[:-2], WIDTH), self.c_proj)
        inner = F.gelu(self._conv1d(self.ln_2(hidden), self.c_fc), approximate="tanh")
        return hidden + self._conv1d(inner, self.c_out)


class GPT2(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(_GPT2Block(), _GPT2Block())

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.blocks(hidden)


@dataclass(frozen=True)
class CompiledModel:
    """A model of the row and the shape of one sample of its input."""

    make: Callable[[], nn.Module]
    sample_shape: tuple[int, ...]


COMPILED_MODELS: dict[str, CompiledModel] = {
    "longformer": CompiledModel(Longformer, (TOKENS, WIDTH)),
    "chunked_cache": CompiledModel(ChunkedCache, (TOKENS, WIDTH)),
    "windowed_gain": CompiledModel(WindowedGain, (TOKENS, WIDTH)),
    "toeplitz": CompiledModel(Toeplitz, (64,)),
    "im2col": CompiledModel(Im2colConv, (3, 12, 12)),
    "gpt2": CompiledModel(GPT2, (TOKENS, WIDTH)),
}


def build(name: str, seed: int = 0) -> tuple[nn.Module, Callable[..., torch.Tensor]]:
    """Model ``name`` with random parameters (in eval mode), and a function making a batch of
    its inputs: ``make_input(batch, seed=0, device=None)``."""
    torch.manual_seed(seed)
    spec = COMPILED_MODELS[name]

    def make_input(batch: int, seed: int = 0, device: str | None = None) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return torch.randn(batch, *spec.sample_shape, generator=generator).to(device)

    return spec.make().eval(), make_input
