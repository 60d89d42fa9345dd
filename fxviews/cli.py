"""The ``fxviews`` command line (``python -m fxviews``, or the ``fxviews`` console script).

Each command is a ``register(subparsers)`` function in :data:`COMMANDS` that adds its
sub-parser and sets ``handler`` to a function taking the parsed arguments and returning the
exit code; a new command adds one entry there.

Example::

    $ python -m fxviews demo
    $ python -m fxviews bench --quick
    $ python -m fxviews bench --help
"""

from __future__ import annotations

import argparse
import inspect
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

import torch

import fxviews
from fxviews.arguments import positive_int
from fxviews.examples import f, push_jvp, seed_args
from fxviews.rewriting.printouts import DEFAULT_WIDTH, fold, format_result

__all__ = ["COMMANDS", "build_parser", "main"]


# --------------------------------------------------------------------------------------------
# demo: the README's push_jvp example, end to end.
# --------------------------------------------------------------------------------------------


_IN_DIMS = (1, 2, 2)


def _largest_error(actual: Any, expected: Any) -> float:
    from fxviews.passes.compat.torch_internals import pytree

    pairs = zip(pytree.tree_leaves(actual), pytree.tree_leaves(expected), strict=True)
    return max(float((a - e).abs().max()) for a, e in pairs)


def _printout_width(text: str) -> int:
    width = positive_int(text)
    if width < 60:
        raise argparse.ArgumentTypeError(f"the printout needs 60 columns or more, got {width}")
    return width


def _run_demo(args: argparse.Namespace) -> int:
    from fxviews.passes.compat.torch_internals import pytree

    gen = torch.Generator().manual_seed(args.seed)
    shape = (4, 6)
    samples = [seed_args(shape, generator=gen) for _ in range(args.batch_size)]
    # torch.stack at the in_dims position: the batch dim is physically there, not just logically.
    batched = [
        torch.stack([sample[i] for sample in samples], dim=bd) for i, bd in enumerate(_IN_DIMS)
    ]
    per_sample = [push_jvp(*sample) for sample in samples]
    reference = pytree.tree_map(lambda *leaves: torch.stack(leaves), *per_sample)

    def say(text: str = "") -> None:  # every line within the printout's width
        print(fold(text, args.width), flush=True)

    say("fxviews demo: a torch.func graph that reads memory through as_strided\n")
    say(textwrap.indent(inspect.getsource(f) + "\n" + inspect.getsource(push_jvp), "    "))

    traced = fxviews.trace(push_jvp, *samples[0])
    say(f"1. fxviews.trace(push_jvp, x, y, yt) on one sample of shape {shape} records:")
    for line in traced.code.splitlines():
        if "= torch.ops.aten.as_strided" in line:
            say("    " + line.strip().split(";")[0])

    raw_error = _largest_error(_vmap_of(traced, batched), reference)
    say(
        f"\n2. vmap(traced graph, in_dims={_IN_DIMS}) over a batch of {args.batch_size}, against "
        f"push_jvp run per sample:\n   largest error {raw_error:.3g}"
        + ("  <- wrong numbers, and no error raised" if raw_error > 0 else "")
    )
    if raw_error == 0 and args.batch_size == 1:
        say(
            "   (a batch of one sample: its batch dim has size 1, so the batched tensors lay "
            "the sample out exactly as the traced strides expect and the bug cannot show; "
            "try --batch-size 2 or more)"
        )

    result = fxviews.rewrite(traced)
    say("\n3. fxviews.rewrite(traced graph):\n")
    say(format_result(result, width=args.width))

    fixed_error = _largest_error(_vmap_of(result.graph_module, batched), reference)
    transform_error = _largest_error(_vmap_of(fxviews.transform(push_jvp), batched), reference)
    say(
        f"\n4. vmap(rewritten graph, in_dims={_IN_DIMS}): largest error {fixed_error:.3g}\n"
        f"   vmap(fxviews.transform(push_jvp), in_dims={_IN_DIMS}): "
        f"largest error {transform_error:.3g}"
    )
    ok = fixed_error == 0 and transform_error == 0
    say("\nresult: " + ("both match the per-sample reference" if ok else "MISMATCH"))
    return 0 if ok else 1


def _vmap_of(fn: Callable[..., Any], batched: Sequence[torch.Tensor]) -> Any:
    return torch.func.vmap(fn, in_dims=_IN_DIMS)(*batched)


def _register_demo(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the push_jvp example end to end: wrong numbers before, right after",
        description=(
            "Trace jvp of a function that mutates a base after taking a view, vmap the graph "
            f"with in_dims={_IN_DIMS} and compare with eager PyTorch per sample; then rewrite "
            "the graph with fxviews, print the rewrite, and compare again. Exits 1 if the "
            "rewritten graph does not match."
        ),
    )
    parser.add_argument(
        "--batch-size", type=positive_int, default=5, help="vmap batch size (default 5)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--width",
        type=_printout_width,
        default=DEFAULT_WIDTH,
        help="printout width, 60 or more (default %(default)s)",
    )
    parser.set_defaults(handler=_run_demo)


# --------------------------------------------------------------------------------------------
# bench: fxviews.bench owns its options and its run.
# --------------------------------------------------------------------------------------------


def _register_bench(subparsers: Any) -> None:
    from fxviews import bench

    parser = subparsers.add_parser(
        "bench",
        help="time the rewritten graphs, transform and the backend against the alternatives",
        description=bench.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_arguments(parser)
    parser.set_defaults(handler=bench.run)


# --------------------------------------------------------------------------------------------
# The parser.
# --------------------------------------------------------------------------------------------

#: One ``register(subparsers)`` per command, in the order ``--help`` lists them.
COMMANDS: list[Callable[[Any], None]] = [_register_demo, _register_bench]


def build_parser() -> argparse.ArgumentParser:
    """The ``fxviews`` argument parser with every command of :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="fxviews",
        description=(
            "Rewrite the as_strided nodes of traced torch.func graphs into verified view ops, "
            "so the graphs vmap/jvp/grad correctly with any memory layout."
        ),
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {_version()} (torch {torch.__version__})"
    )
    subparsers = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    subparsers.required = True
    for register in COMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); return the exit code.

    Example::

        >>> fxviews.cli.main(["demo", "--batch-size", "3"])
        0
    """
    args = build_parser().parse_args(argv)
    return args.handler(args)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fxviews")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"
