"""The small programs of the bench's "small programs" row: a few ops each, as research code
writes them per sample and hands to ``vmap``.

Each is a per-sample function and the shapes of one sample's arguments (small: where eager
``vmap``'s own per-op cost is most of a call, and anything ``transform`` adds shows). The
higher-order ones (``grad``, ``jvp``, ``vjp`` inside) are where tracing once pays most; the
first-order ones are where it must not cost. Random init with a fixed seed, nothing downloaded.

Example::

    >>> fn, shapes = PROGRAMS["rotary"]
    >>> fn(*[torch.randn(shape) for shape in shapes]).shape
    torch.Size([8, 16])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's own convention
from torch import nn

__all__ = ["PROGRAMS", "arguments", "in_dims"]

_generator = torch.Generator().manual_seed(0)
_D = 16


def _weight(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_generator) / shape[-1] ** 0.5


_W, _W2 = _weight(_D, _D), _weight(_D, _D)
_GATES_X, _GATES_H = _weight(_D, 3 * _D), _weight(_D, 3 * _D)
with torch.random.fork_rng():
    torch.manual_seed(0)
    _GRU = nn.GRUCell(_D, _D)
    _MLP = nn.Sequential(nn.Linear(_D, 32), nn.Tanh(), nn.Linear(32, 4))
    _NORM = nn.LayerNorm(_D)
_ANGLES = torch.outer(torch.arange(8.0), 1e-2 ** (torch.arange(_D // 2) / (_D // 2)))
_COS, _SIN = _ANGLES.cos(), _ANGLES.sin()


def kv_cache_write(cache: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Write this step's key at position 3 of a (heads, time, dim) cache, then attend."""
    cache = cache.clone()
    cache[:, 3] = k
    return cache[:, :4] @ k.unsqueeze(-1)


def kv_cache_write_at(cache: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The same write at a position held in a 0-d tensor (a decoder's step counter)."""
    cache = cache.clone()
    cache[:, pos] = k
    return cache


def rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of (time, dim) queries, halves rotated."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * _COS - x2 * _SIN, x1 * _SIN + x2 * _COS], dim=-1)


def gru_step(x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """One step of ``nn.GRUCell``."""
    return _GRU(x, h)


def gru_step_written(x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """One GRU step written out: gates from two products, chunked."""
    r, z, n = (x @ _GATES_X).chunk(3, -1)
    hr, hz, hn = (h @ _GATES_H).chunk(3, -1)
    r, z = torch.sigmoid(r + hr), torch.sigmoid(z + hz)
    return (1 - z) * torch.tanh(n + r * hn) + z * h


def adam_step(
    p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One Adam update of a parameter vector (bias-corrected, step 10)."""
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    m_hat, v_hat = m / (1 - 0.9**10), v / (1 - 0.999**10)
    return p - 1e-3 * m_hat / (v_hat.sqrt() + 1e-8), m, v


def sgd_momentum_in_place(p: torch.Tensor, g: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
    """SGD with momentum on copies, in place, as torch.optim writes it."""
    p, buf = p.clone(), buf.clone()
    buf.mul_(0.9).add_(g)
    p.add_(buf, alpha=-0.1)
    return p


def window_sum(x: torch.Tensor) -> torch.Tensor:
    """Sums over sliding windows of 4 (``unfold``)."""
    return x.unfold(0, 4, 1).sum(-1)


def window_sum_strided(x: torch.Tensor) -> torch.Tensor:
    """The same windows through ``as_strided`` (wrong under eager ``vmap`` but batch-first)."""
    return x.as_strided((x.numel() - 3, 4), (1, 1)).sum(-1)


def causal_conv(x: torch.Tensor) -> torch.Tensor:
    """A causal 1-d convolution of a (channels, time) signal, left-padded."""
    return F.conv1d(F.pad(x, (2, 0)).unsqueeze(0), _W[:4, :12].reshape(4, 4, 3)).squeeze(0)


def layer_norm_mlp(x: torch.Tensor) -> torch.Tensor:
    """A residual pre-norm MLP on (tokens, dim)."""
    return x + torch.relu(_NORM(x) @ _W) @ _W2


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal softmax attention written out, (time, dim) each."""
    scores = q @ k.T / _D**0.5
    mask = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool).tril()
    return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v


def q_value(s: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """A Q-network's value of the action taken (a 0-d integer tensor)."""
    return _MLP(s)[a]


def discounted_returns(r: torch.Tensor) -> torch.Tensor:
    """Discounted returns of a short episode, a Python loop backwards over time."""
    out, running = [], r.new_zeros(())
    for t in range(r.shape[0] - 1, -1, -1):
        running = r[t] + 0.99 * running
        out.append(running)
    return torch.stack(out[::-1])


def gumbel_softmax_sample(logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Gumbel-softmax relaxation from given uniform noise."""
    return F.softmax((logits - torch.log(-torch.log(u.clamp(1e-6, 1 - 1e-6)))) / 0.5, -1)


def per_sample_grad(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The gradient of a squared error through a tanh layer, wrt its weight."""

    def loss(w: torch.Tensor) -> torch.Tensor:
        return ((torch.tanh(x @ w) - y) ** 2).sum()

    return torch.func.grad(loss)(_W)


def jvp_tanh_mlp(x: torch.Tensor, t: torch.Tensor) -> Any:
    """A forward-mode directional derivative of a two-layer tanh MLP."""
    return torch.func.jvp(lambda x: torch.tanh(torch.tanh(x @ _W) @ _W2), (x,), (t,))


def hvp(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """A Hessian-vector product (forward over reverse) of a small energy."""

    def energy(x: torch.Tensor) -> torch.Tensor:
        return (torch.tanh(x @ _W) ** 2).sum()

    return torch.func.jvp(torch.func.grad(energy), (x,), (t,))[1]


def maml_inner_step(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A MAML inner step and the query loss's gradient through it (second order)."""

    def loss(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return ((x @ w - y) ** 2).mean()

    def outer(w: torch.Tensor) -> torch.Tensor:
        adapted = w - 0.1 * torch.func.grad(loss)(w, x)
        return loss(adapted, x.flip(0))

    return torch.func.grad(outer)(w)


def push_views(x: torch.Tensor, y: torch.Tensor, yt: torch.Tensor) -> Any:
    """The README's push_jvp: a view of a base overwritten under forward AD."""

    def body(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        base = x.clone()
        view = base[0]
        base.copy_(y)
        return view, base

    return torch.func.jvp(body, (y,), (yt,))


#: Each program: the per-sample function and its arguments, one sample's shapes (an int ``n``
#: is a 0-d integer tensor below ``n``).
PROGRAMS: dict[str, tuple[Callable[..., Any], list[Any]]] = {
    "kv_cache_write": (kv_cache_write, [(2, 8, _D), (2, _D)]),
    "kv_cache_write_at": (kv_cache_write_at, [(2, 8, _D), (2, _D), 8]),
    "rotary": (rotary, [(8, _D)]),
    "gru_step": (gru_step, [(_D,), (_D,)]),
    "gru_step_written": (gru_step_written, [(_D,), (_D,)]),
    "adam_step": (adam_step, [(64,), (64,), (64,), (64,)]),
    "sgd_momentum": (sgd_momentum_in_place, [(64,), (64,), (64,)]),
    "window_sum": (window_sum, [(32,)]),
    "window_sum_strided": (window_sum_strided, [(32,)]),
    "causal_conv": (causal_conv, [(4, 16)]),
    "layer_norm_mlp": (layer_norm_mlp, [(8, _D)]),
    "attention": (attention, [(8, _D), (8, _D), (8, _D)]),
    "q_value": (q_value, [(_D,), 4]),
    "discounted_returns": (discounted_returns, [(8,)]),
    "gumbel_softmax": (gumbel_softmax_sample, [(6,), (6,)]),
    "per_sample_grad": (per_sample_grad, [(4, _D), (4, _D)]),
    "jvp_tanh_mlp": (jvp_tanh_mlp, [(_D,), (_D,)]),
    "hvp": (hvp, [(_D,), (_D,)]),
    "maml_inner_step": (maml_inner_step, [(_D, 1), (8, _D), (8, 1)]),
    "push_jvp": (push_views, [(5, 6), (5, 6), (5, 6)]),
}


def arguments(name: str, batch: int, batch_dim: int) -> tuple[torch.Tensor, ...]:
    """A batch of ``batch`` samples of program ``name``'s arguments, the batch dim physically
    at ``batch_dim`` of each tensor (0 for the 0-d indices)."""
    generator = torch.Generator().manual_seed(len(name))
    batched = []
    for spec in PROGRAMS[name][1]:
        if isinstance(spec, int):
            batched.append(torch.randint(spec, (batch,), generator=generator))
            continue
        samples = [torch.rand(spec, generator=generator) + 0.1 for _ in range(batch)]
        batched.append(torch.stack(samples, dim=batch_dim))
    return tuple(batched)


def in_dims(name: str, batch_dim: int) -> tuple[int, ...]:
    """``vmap``'s ``in_dims`` for :func:`arguments`."""
    return tuple(0 if isinstance(spec, int) else batch_dim for spec in PROGRAMS[name][1])
