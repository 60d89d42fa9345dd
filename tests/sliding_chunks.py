"""Longformer-style local attention, written here in the style of the real model's code.

Each token attends to ``window`` tokens on either side. As Longformer's self-attention does it,
the sequence is cut into overlapping chunks of ``2 * window`` tokens, ``window`` apart, with an
``as_strided`` over the chunked tensor's own strides; the chunks' score matrices are realigned
into one band per token by padding and viewing them with their last two dims swapped; the
band is written into a zero buffer slice by slice; the positions of the first and last window
that fall outside the sequence are masked in place; and the values are chunked, three windows
wide, from a padded copy, against probabilities skewed by pad-and-view. Small, random init, no
downloads: the programs the real-model tests run through ``transform``.

:class:`SlidingChunkSelfAttention` is a whole self-attention layer called directly as the real
one is (a batch of one, ``(1, tokens, dim)``), with the attention mask a model makes when given
none: zeros, made inside from the input's sizes (so the mask's band is a result that depends on
no input). :func:`sliding_chunk_attention` is the attention alone, of per-head ``q``, ``k``,
``v`` of shape ``(1, tokens, heads, head_dim)``.

Example::

    >>> attention = SlidingChunkSelfAttention(dim=8, heads=2, window=2)
    >>> attention(torch.randn(1, 16, 8)).shape
    torch.Size([1, 16, 8])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SlidingChunkSelfAttention", "sliding_chunk_attention"]


def _overlapping_chunks(x: torch.Tensor, window: int) -> torch.Tensor:
    """``(rows, tokens, d)`` as ``(rows, tokens // window - 1, 2 * window, d)``: chunks of
    ``2 * window`` tokens every ``window`` tokens, an as_strided over the strides of ``x``'s
    non-overlapping chunks (their chunk stride halved)."""
    rows, tokens, d = x.shape
    # The chunk count as the real code computes it: torch.div of two ints, a tensor whose
    # value the view reads as a size (a recording refuses that read: transform traces in
    # fake mode).
    halves = x.view(rows, torch.div(tokens, 2 * window, rounding_mode="trunc"), 2 * window, d)
    sizes, strides = list(halves.shape), list(halves.stride())
    sizes[1], strides[1] = 2 * sizes[1] - 1, strides[1] // 2
    return halves.as_strided(sizes, strides)


def _padded_and_flipped(x: torch.Tensor, padding: tuple[int, ...]) -> torch.Tensor:
    """``x`` padded, then viewed with its last two sizes swapped (not transposed): each
    diagonal of a chunk's scores becomes a column."""
    x = F.pad(x, padding)
    return x.view(*x.shape[:-2], x.shape[-1], x.shape[-2])


def _skewed(x: torch.Tensor) -> torch.Tensor:
    """``(rows, chunks, window, 2 * window + 1)`` bands shifted one place right per row, so
    each band lines up with the values chunk: pad, flatten, drop the tail, view back."""
    rows, chunks, window, width = x.shape
    flat = F.pad(x, (0, window + 1)).view(rows, chunks, -1)[:, :, :-window]
    return flat.view(rows, chunks, window, window + width)[:, :, :, :-1]


def _mask_outside_the_sequence(scores: torch.Tensor, window: int) -> None:
    """Set to -inf, in place, the band positions of the first and last ``window`` tokens that
    reach before the first token or past the last."""
    start = scores.new_ones(window, window + 1).tril().flip(dims=[0])[None, :, None, :]
    end = start.flip(dims=(1, 3))
    head = scores[:, :window, :, : window + 1]
    scores[:, :window, :, : window + 1] = torch.full_like(head, -float("inf")).where(
        start.expand(head.shape).bool(), head
    )
    tail = scores[:, -window:, :, -(window + 1) :]
    scores[:, -window:, :, -(window + 1) :] = torch.full_like(tail, -float("inf")).where(
        end.expand(tail.shape).bool(), tail
    )


def _banded_scores(query: torch.Tensor, key: torch.Tensor, window: int) -> torch.Tensor:
    """``(batch, tokens, heads, 2 * window + 1)``: each token's scores against the tokens of
    its band, from ``(batch, tokens, heads, d)`` queries and keys."""
    batch, tokens, heads, d = query.shape
    query, key = (t.transpose(1, 2).reshape(batch * heads, tokens, d) for t in (query, key))
    products = torch.einsum(
        "rcxd,rcyd->rcxy", _overlapping_chunks(query, window), _overlapping_chunks(key, window)
    )
    diagonals = _padded_and_flipped(products, (0, 0, 0, 1))
    band = diagonals.new_zeros(batch * heads, tokens // window, window, 2 * window + 1)
    band[:, :-1, :, window:] = diagonals[:, :, :window, : window + 1]
    band[:, -1, :, window:] = diagonals[:, -1, window:, : window + 1]
    band[:, 1:, :, :window] = diagonals[:, :, -(window + 1) : -1, window + 1 :]
    band[:, 0, 1:window, 1:window] = diagonals[:, 0, : window - 1, 1 - window :]
    scores = band.view(batch, heads, tokens, 2 * window + 1).transpose(2, 1)
    _mask_outside_the_sequence(scores, window)
    return scores


def _banded_context(probabilities: torch.Tensor, value: torch.Tensor, window: int) -> torch.Tensor:
    """``(batch, tokens, heads, d)``: each token's probabilities over its band applied to the
    values there; the values chunked three windows wide from a copy padded by a window."""
    batch, tokens, heads, d = value.shape
    rows = batch * heads
    bands = probabilities.transpose(1, 2).reshape(rows, tokens // window, window, 2 * window + 1)
    padded = F.pad(value.transpose(1, 2).reshape(rows, tokens, d), (0, 0, window, window), value=-1)
    stride = padded.stride()
    chunks = padded.as_strided(
        (rows, tokens // window, 3 * window, d),
        (stride[0], window * stride[1], stride[1], stride[2]),
    )
    context = torch.einsum("rcwd,rcdh->rcwh", _skewed(bands), chunks)
    return context.view(batch, heads, tokens, d).transpose(1, 2)


def sliding_chunk_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, window: int = 2
) -> torch.Tensor:
    """Local attention of ``(1, tokens, heads, d)`` queries, keys and values over a band of
    ``window`` tokens on either side; ``tokens`` a multiple of ``2 * window``."""
    probabilities = _banded_scores(query, key, window).softmax(dim=-1)
    return _banded_context(probabilities, value, window)


class SlidingChunkSelfAttention(nn.Module):
    """A Longformer-style self-attention layer over ``(1, tokens, dim)`` hidden states, with
    no token masked: the mask is made inside, as zeros of the input's sizes, and its band
    added to the scores."""

    def __init__(self, dim: int, heads: int, window: int) -> None:
        super().__init__()
        self.heads, self.window = heads, window
        self.query, self.key, self.value = (nn.Linear(dim, dim) for _ in range(3))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = hidden.shape
        d = dim // self.heads

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, tokens, self.heads, d)

        query = heads(self.query(hidden) / d**0.5)
        key, value = heads(self.key(hidden)), heads(self.value(hidden))
        scores = _banded_scores(query, key, self.window)
        masked = torch.zeros(hidden.shape[:2], dtype=hidden.dtype, device=hidden.device) != 0
        float_mask = masked.type_as(query).masked_fill(masked, torch.finfo(query.dtype).min)
        float_mask = float_mask[:, :, None, None]
        scores = scores + _banded_scores(
            float_mask.new_ones(float_mask.shape), float_mask, self.window
        )
        probabilities = scores.softmax(dim=-1).masked_fill(masked[:, :, None, None], 0.0)
        return _banded_context(probabilities, value, self.window).reshape(batch, tokens, dim)
