"""Measure which aten kernels assume their inputs' memory layout.

Run it as ``python -m tests.kernel_layout_sweep`` (a few minutes; ``--limit N`` for a first N
OpInfo entries only). It prints one line per aten overload that fails, and the table that
``fxviews.passes.rewrites.pinning.LAYOUT_KERNELS`` holds came from it.

How: every OpInfo entry's first CPU float32 samples and the scaled-dot-product-attention family
(math and the CPU flash kernel, with and without a mask, causal or not) are traced with
``make_fx``, forward and, where the op is differentiable, under ``torch.func.vjp``. Every aten
call in those graphs is then run on the values it saw, three ways, on ``BATCH`` samples:

- the reference: one contiguous sample at a time, in a Python loop;
- ``vmap`` with every tensor's batch dim physically first (each sample contiguous);
- ``vmap`` with every tensor's batch dim physically last (each sample non-contiguous).

An overload *assumes a layout* when batch-first matches the reference and batch-last raises or
returns other numbers. Batch-first failures (missing batching rules, random ops, data-dependent
shapes) say nothing about layout and are not counted.

Example::

    $ python -m tests.kernel_layout_sweep --limit 50
"""

from __future__ import annotations

import argparse
import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch.func import vjp, vmap
from torch.fx.experimental.proxy_tensor import make_fx

BATCH = 3
SAMPLES_PER_OP = 3
MAX_NUMEL = 512
CALLS_PER_OVERLOAD = 6


def _with_vjp(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``'s outputs and the vjp of their sum of squares with respect to every input."""

    def pulled(*tensors: torch.Tensor) -> Any:
        out, back = vjp(fn, *tensors)
        cotangents = pytree.tree_map(
            lambda t: torch.ones_like(t) if isinstance(t, torch.Tensor) else t, out
        )
        return out, back(cotangents)

    return pulled


def _sdpa_cases() -> Iterator[tuple[str, Callable[..., Any], tuple[torch.Tensor, ...]]]:
    shape = (2, 3, 4, 8)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=gen) for _ in range(3))
    mask = torch.randn(4, 4, generator=gen)
    for causal in (False, True):
        yield (
            f"sdpa causal={causal}",
            functools.partial(F.scaled_dot_product_attention, is_causal=causal),
            (q, k, v),
        )
        yield (
            f"sdpa math causal={causal}",
            functools.partial(torch.ops.aten._scaled_dot_product_attention_math, is_causal=causal),
            (q, k, v),
        )
    yield (
        "sdpa mask",
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m),
        (
            q,
            k,
            v,
            mask,
        ),
    )


def _opinfo_cases(limit: int | None) -> Iterator[tuple[str, Callable[..., Any], tuple]]:
    from torch.testing._internal.common_methods_invocations import op_db

    for op in op_db[:limit]:
        if not op.supports_dtype(torch.float32, "cpu"):
            continue
        try:
            samples = list(op.sample_inputs("cpu", torch.float32))[:SAMPLES_PER_OP]
        except Exception:  # a sample generator that needs what this machine lacks
            continue
        for sample in samples:
            leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
            tensors = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
            if not tensors or any(leaves[i].numel() > MAX_NUMEL for i in tensors):
                continue

            def call(*ts: torch.Tensor, leaves=leaves, spec=spec, tensors=tensors, op=op) -> Any:
                filled = list(leaves)
                for i, t in zip(tensors, ts, strict=True):
                    filled[i] = t
                inp, args, kwargs = pytree.tree_unflatten(filled, spec)
                return op.op(inp, *args, **kwargs)

            yield op.name, call, tuple(leaves[i] for i in tensors)


def _aten_calls(fn: Callable[..., Any], args: tuple) -> list[tuple[Any, tuple, dict]]:
    """Every aten call ``fn(*args)`` makes, with the concrete values it was made on."""
    gm = make_fx(fn)(*args)
    calls: list[tuple[Any, tuple, dict]] = []

    class Recorder(torch.fx.Interpreter):
        def call_function(self, target: Any, a: tuple, kw: dict) -> Any:
            if isinstance(target, torch._ops.OpOverload):
                calls.append((target, a, kw))
            return super().call_function(target, a, kw)

    Recorder(gm).run(*args)
    return calls


def _samples(value: Any, b: int) -> Any:
    """Sample ``b`` of a value: floats scaled by a positive factor (domains stay valid)."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return (value * (1.0 + b / 8)).contiguous()
    return value.clone() if isinstance(value, torch.Tensor) else value


#: What :func:`_assumes_layout` says when batch-first fails too: not a layout question.
NOT_MEASURABLE = "not measurable"


def _assumes_layout(target: Any, args: tuple, kwargs: dict) -> str | None:
    """Why ``target`` fails with each sample non-contiguous under vmap, None if it does not,
    or :data:`NOT_MEASURABLE`."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    slots = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) and x.dim() > 0]
    if not slots:
        return NOT_MEASURABLE

    def run(*ts: torch.Tensor) -> Any:
        filled = list(leaves)
        for i, t in zip(slots, ts, strict=True):
            filled[i] = t
        a, kw = pytree.tree_unflatten(filled, spec)
        return target(*a, **kw)

    per_sample = [[_samples(leaves[i], b) for i in slots] for b in range(BATCH)]
    try:
        first, second = run(*per_sample[0]), run(*per_sample[0])
        torch.testing.assert_close(first, second, equal_nan=True)
        expected = [run(*s) for s in per_sample]
        first_dims = [0] * len(slots)
        batched = [torch.stack([s[j] for s in per_sample]) for j in range(len(slots))]
        _compare(vmap(run, in_dims=tuple(first_dims))(*batched), expected)
    except Exception:  # not a layout question: random, unbatchable or unsupported
        return NOT_MEASURABLE
    last_dims = tuple(leaves[i].dim() for i in slots)
    batched = [torch.stack([s[j] for s in per_sample], dim=d) for j, d in enumerate(last_dims)]
    try:
        _compare(vmap(run, in_dims=last_dims)(*batched), expected)
    except AssertionError as err:
        return "wrong numbers: " + str(err).splitlines()[0]
    except Exception as err:  # the kernel refused the layout
        return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return None


def _compare(actual: Any, expected: list[Any]) -> None:
    stacked = pytree.tree_map(lambda *xs: torch.stack(xs), *expected)
    torch.testing.assert_close(actual, stacked, equal_nan=True, rtol=1e-4, atol=1e-4)


def sweep(limit: int | None = None) -> dict[str, str]:
    """{aten overload name: why it assumes a layout} over the OpInfo and SDPA cases."""
    found: dict[str, str] = {}
    tried: dict[Any, int] = {}
    cases = [*_sdpa_cases(), *_opinfo_cases(limit)]
    for name, fn, args in cases:
        for traced in (fn, _with_vjp(fn)):
            try:
                calls = _aten_calls(traced, args)
            except Exception:  # not traceable, or not differentiable
                continue
            for target, a, kw in calls:
                if tried.get(target, 0) >= CALLS_PER_OVERLOAD or str(target) in found:
                    continue
                why = _assumes_layout(target, a, kw)
                if why == NOT_MEASURABLE:
                    continue
                tried[target] = tried.get(target, 0) + 1
                if why is not None:
                    found[str(target)] = f"{why} (from {name})"
                    print(f"{target}: {found[str(target)]}", flush=True)
    print(f"{len(tried)} aten overloads measured, {len(found)} assume a layout")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="first N OpInfo entries only")
    options = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    sweep(options.limit)


if __name__ == "__main__":
    main()
