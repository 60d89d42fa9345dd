"""fxviews against torch-mlir's FX pre-pass for as_strided, in IREE: ``python -m
fxviews.bench.mlir_as_strided``.

Note [Two ways to import as_strided into MLIR]
----------------------------------------------
IREE's importer (``iree.compiler.extras.fx_importer``) runs torch-mlir's ``fx_as_strided``
pass on every program it imports: each ``as_strided`` becomes an ``aten.index`` of the tensor
whose storage it reads, at constant index tensors (one per dim of that tensor, each of the
result's size) computed at import from the traced strides. fxviews writes the same read as
view ops (``slice``, ``view``, ``permute``, ``unfold``), which carry no constants. For each
program this module exports it, then:

- ``torch-mlir``: hands the plain program to IREE (its importer runs the pass); the op and
  constant counts are read off the pass run on a fresh export of the same program;
- ``fxviews``: hands ``fxviews.rewrite(ep)`` (its default, ``opset="aten"``) to IREE
  (nothing is left for the pass);

compiles each for ``llvm-cpu``, runs it on two inputs other than the example against eager,
and times one call (median of interleaved repeats). Programs are sized like a model's layer, so
the constants show in the module's size. Needs the ``iree`` extra.
"""

from __future__ import annotations

import argparse
import functools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tabulate
import torch

from fxviews.bench.timing import median_seconds
from fxviews.consumers.export.program import rewrite_exported
from fxviews.passes.compat.torch_internals import pytree

aten = torch.ops.aten

Run = Callable[[Sequence[torch.Tensor]], list[torch.Tensor]]


def compile_for_iree(ep: torch.export.ExportedProgram) -> tuple[bytes, Run]:
    """``ep`` compiled by IREE for ``llvm-cpu``: the module's bytes and a function running its
    ``main`` on CPU tensors. IREE's importer edits ``ep`` in place (its as_strided pass).

    Example::

        >>> vmfb, run = compile_for_iree(torch.export.export(module, args))
        >>> run(args)   # a list of tensors
    """
    import iree.runtime as rt
    import iree.turbine.aot as aot

    # Any: turbine's stubs type compile()'s in-memory result as a memoryview, not its mapping.
    compiled: Any = aot.export(ep).compile(save_to=None, target_backends="llvm-cpu")
    vmfb = bytes(compiled.map_memory())
    config = rt.Config("local-task")
    context = rt.SystemContext(config=config)
    context.add_vm_module(rt.VmModule.copy_buffer(config.vm_instance, vmfb))
    main = context.modules.module["main"]

    def run(args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        results = main(*[a.numpy() for a in args])
        results = results if isinstance(results, (list, tuple)) else [results]
        return [torch.from_numpy(np.array(r.to_host())) for r in results]

    return vmfb, run


class Windows(torch.nn.Module):
    """Overlapping windows of 3 over a signal, weighted: a 1-D convolution written by hand."""

    def forward(self, x, w):
        n = x.shape[0]
        return x.as_strided((n - 2, 3), (1, 1)) @ w


class TransposedWindows(torch.nn.Module):
    """The same windows down the first column of a transposed product."""

    def forward(self, x, y):
        z = (x @ y).t()
        return z.as_strided((z.shape[1] - 2, 3), (1, 1)).sum(-1)


class SlicedRows(torch.nn.Module):
    """Rows of a column slice (storage offset 1)."""

    def forward(self, x):
        rows, cols = x.shape
        return x[:, 1:].as_strided((rows, cols - 1), (cols, 1), 1) * 2


class LongformerChunks(torch.nn.Module):
    """Longformer's overlapping chunks of queries and keys in a (batch * heads) layout."""

    def __init__(self, window: int) -> None:
        super().__init__()
        self.window = window

    def forward(self, query, key):
        batch, length, heads, dim = query.shape
        w = self.window

        def chunks(t: torch.Tensor) -> torch.Tensor:
            t = t.transpose(1, 2).reshape(batch * heads, length, dim)
            c = t.view(batch * heads, length // (2 * w), 2 * w, dim)
            sizes = [batch * heads, 2 * c.size(1) - 1, 2 * w, dim]
            return c.as_strided(sizes, [c.stride(0), c.stride(1) // 2, c.stride(2), 1])

        return torch.einsum("bcxd,bcyd->bcxy", chunks(query), chunks(key))


@dataclass(frozen=True)
class Program:
    name: str
    make: Callable[[], torch.nn.Module]
    shapes: tuple[tuple[int, ...], ...]


PROGRAMS = (
    Program("windows of an input", Windows, ((65536,), (3, 16))),
    Program("windows of a transposed product", TransposedWindows, ((4096, 64), (64, 256))),
    Program("rows of a column slice", SlicedRows, ((512, 513),)),
    Program("Longformer chunks", lambda: LongformerChunks(64), ((1, 512, 12, 64),) * 2),
)


@dataclass(frozen=True)
class Measured:
    right: bool
    ops: str
    constant_bytes: int
    module_bytes: int
    seconds: float


def measure(program: Program, repeats: int) -> dict[str, Measured]:
    """Both routes of one program (see the Note)."""
    module = program.make().eval()

    def sample(seed: int) -> tuple[torch.Tensor, ...]:
        gen = torch.Generator().manual_seed(seed)
        return tuple(torch.randn(s, generator=gen) for s in program.shapes)

    def export() -> torch.export.ExportedProgram:
        return torch.export.export(module, sample(0))

    routes = {"torch-mlir": (export(), _mlir_ops(export())), "fxviews": _fxviews(export())}
    runs: dict[str, Run] = {}
    out = {}
    for name, (ep, (ops, constant_bytes)) in routes.items():
        vmfb, run = compile_for_iree(ep)
        runs[name] = run
        right = all(_right(run(args), module(*args)) for args in (sample(1), sample(2)))
        out[name] = (right, ops, constant_bytes, len(vmfb))
    args = sample(1)
    calls = {name: functools.partial(run, args) for name, run in runs.items()}
    times = median_seconds(calls, repeats, 0.05)
    return {name: Measured(*fields, times[name]) for name, fields in out.items()}


def _mlir_ops(ep: torch.export.ExportedProgram) -> tuple[str, int]:
    """The ops torch-mlir's pass puts in place of the program's as_strided, and the bytes of
    the index constants it attaches."""
    from iree.compiler.extras.fx_as_strided import rewrite_as_strided

    before = _op_counts(ep.graph_module)
    rewrite_as_strided(ep.graph_module.graph)
    after = _op_counts(ep.graph_module)
    constants = [b for n, b in ep.graph_module.named_buffers() if n.startswith("_torch_mlir")]
    return _added(before, after), sum(b.numel() * b.element_size() for b in constants)


def _fxviews(ep: torch.export.ExportedProgram) -> tuple[Any, tuple[str, int]]:
    res = rewrite_exported(ep)
    before = _op_counts(ep.run_decompositions({}).graph_module)
    return res.exported_program, (_added(before, _op_counts(res.graph_module)), 0)


def _op_counts(gm: torch.fx.GraphModule) -> Counter[str]:
    return Counter(
        str(n.target).replace("aten.", "").split(".")[0]
        for n in gm.graph.nodes
        if n.op == "call_function"
    )


def _added(before: Counter[str], after: Counter[str]) -> str:
    """The ops ``after`` has more of than ``before``, ``as_strided`` less: ``"-1 as_strided,
    +2 slice"``."""
    changes = [f"-{before[o] - after[o]} {o}" for o in before if before[o] > after[o]]
    changes += [f"+{after[o] - before[o]} {o}" for o in after if after[o] > before[o]]
    return ", ".join(changes)


def _right(got: list[torch.Tensor], want: Any) -> bool:
    leaves = pytree.tree_leaves(want)
    return len(got) == len(leaves) and all(
        g.shape == w.shape and torch.allclose(g, w.detach(), rtol=1e-4, atol=1e-3)
        for g, w in zip(got, leaves, strict=True)
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=21, help="timing repeats (default 21)")
    options = parser.parse_args(argv)
    rows = []
    for program in PROGRAMS:
        for route, m in measure(program, options.repeats).items():
            rows.append(
                [
                    program.name,
                    route,
                    "right" if m.right else "WRONG",
                    m.ops,
                    f"{m.constant_bytes / 1024:.0f} KiB",
                    f"{m.module_bytes / 1024:.0f} KiB",
                    f"{m.seconds * 1e6:.0f} us",
                ]
            )
    headers = ["program", "route", "in IREE", "ops", "constants", ".vmfb", "one call"]
    print(tabulate.tabulate(rows, headers, tablefmt="github"))


if __name__ == "__main__":
    main()
