"""First calls, each in a fresh interpreter (rows 6 and 7 of the full run) or in this one."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from fxviews.bench.compile_paths import COMPILE_FUNCTIONS, Wrap, compiled_path_wrap
from fxviews.bench.report import measured
from fxviews.bench.research_programs import BENCH_SHAPES, per_sample
from fxviews.bench.settings import COMPILED_BATCH, USER_AS_STRIDED_BATCH, Settings
from fxviews.bench.timing import FirstCall, first_call
from fxviews.bench.workloads import make_push_jvp, on, seed_batch
from fxviews.examples import seed_args

# --- first calls in fresh interpreters ---------------------------------------------------------
#
# Note [Cold compiles]
# A compile takes ~0.2-2 s, and a median of three in one process swings by 20% with the load
# of a shared machine and with what earlier compiles left in the process. Rows 6 and 7 (full
# run) therefore time each compile in a fresh interpreter, every path in the same conditions:
# the child imports torch, fxviews, Dynamo and Inductor, compiles a small unrelated function
# on the same path (Inductor's one-time work in a process: probing the C++ compiler and the
# CPU's vector ISA, ~20 s of CPU on an empty cache, is not what is compared), then makes one
# first call (see first_call: caches off, so the graph's code is compiled from scratch) and
# prints its FirstCall. Inductor compiles in the child itself (TORCHINDUCTOR_COMPILE_THREADS
# =1), so the C++ compilers it runs are children the process waits for and their CPU time is
# counted; a pool of workers would outlive the measurement and its CPU time could not be read.
# The paths alternate, one child each per round, so a burst of load hits them alike; CPU time
# (which leaves out waiting for a core) is what the ratios compare, wall time stands beside it.

#: What a cold-compile child runs: ``cold_child(request)``.
_CHILD = "import sys; from fxviews.bench.cold import cold_child; cold_child(sys.argv[1])"


@dataclass(frozen=True)
class FirstCallCase:
    """A first call that a fresh interpreter can rebuild: row 6's or row 7's path and function."""

    row: str  # "compile", "compiled" or "user_as_strided"
    path: str  # a backend of row 6, or a path of rows 7 and 11
    # One of COMPILE_FUNCTIONS (row 6), or a research program and how vmap applies (row 11).
    function: str = "push_jvp (forward)"
    batch: int = COMPILED_BATCH  # row 7's
    device: str | None = None  # where the arguments live (None: CPU)

    def build(
        self,
    ) -> tuple[Callable[[], Callable[..., Any]], Wrap, tuple[torch.Tensor, ...], bool]:
        """``(make_fn, wrap, args, backward)`` for :func:`first_call`."""
        if self.row == "compiled":
            _, batched = seed_batch(self.batch, self.device)
            return make_push_jvp, compiled_path_wrap(self.path), batched, False
        if self.row == "user_as_strided":
            name, kind = self.function.split(" ", 1)
            batch = torch.randn(USER_AS_STRIDED_BATCH, *BENCH_SHAPES[name])
            make = functools.partial(per_sample, name, kind)
            return make, compiled_path_wrap(self.path), (batch,), False
        make_fn, train = COMPILE_FUNCTIONS[self.function]
        args = tuple(t.requires_grad_(train) for t in on(self.device, seed_args()))
        return make_fn, functools.partial(torch.compile, backend=self.path), args, train


def cold_first_call(case: FirstCallCase, threads: int) -> FirstCall:
    """:func:`first_call` of ``case`` in a fresh interpreter (see Note [Cold compiles])."""
    request = json.dumps({**dataclasses.asdict(case), "threads": threads})
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    command = [sys.executable, "-c", _CHILD, request]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise RuntimeError(
            f"cold compile exited with {done.returncode}: {lines[-1] if lines else ''}"
        )
    return FirstCall(**json.loads(done.stdout.strip().splitlines()[-1]))


def cold_child(request: str) -> None:
    """The child's side of :func:`cold_first_call`: one first call, printed as JSON."""
    spec = json.loads(request)
    torch.set_num_threads(spec.pop("threads"))
    case = FirstCallCase(**spec)
    make_fn, wrap, args, backward = case.build()
    # Imports and a process's one-time compile work are not what is compared: every path
    # gets Dynamo and Inductor loaded and one small compile of its own beforehand, on the
    # case's device.
    from fxviews.passes.compat.torch_internals import compile_fx

    del compile_fx  # imported for its import's sake
    first_call(_warm_up_function, wrap, on(case.device, (torch.randn(4, 3),)))
    print(json.dumps(dataclasses.asdict(first_call(make_fn, wrap, args, backward))), flush=True)


def _warm_up_function() -> Callable[..., Any]:
    """A small function unlike the measured ones, for a child's warm-up compile."""

    def warm_up(x: torch.Tensor) -> torch.Tensor:
        return (x.sin() * 2).sum()

    return warm_up


def first_call_samples(
    cases: Mapping[str, FirstCallCase], settings: Settings
) -> dict[str, tuple[list[FirstCall], str]]:
    """First calls of each case, the cases alternating: per case the samples and a note.

    Cold (``settings.cold_compiles`` children per case) in the full run; in this process
    after one warm-up in ``--quick``. A case that raises gets no more samples and an
    ``n/a (error: ...)`` note, the others go on.
    """
    from fxviews.passes.compat.torch_internals import reset_dynamo

    cold = settings.cold_compiles > 0
    threads = torch.get_num_threads()
    built = {name: case.build() for name, case in cases.items()} if not cold else {}
    samples: dict[str, list[FirstCall]] = {name: [] for name in cases}
    notes = dict.fromkeys(cases, "")

    def sample(name: str) -> float:
        if cold:
            call = cold_first_call(cases[name], threads)
        else:
            call = first_call(*built[name][:3], backward=built[name][3])
        samples[name].append(call)
        return call.wall_s

    try:
        if not cold:  # imports, lazy initialisation and Dynamo's own first-time costs
            for name in cases:
                notes[name] = measured(functools.partial(sample, name))[1]
                samples[name].clear()
        for _ in range(settings.cold_compiles if cold else settings.compile_repeats):
            for name in cases:
                if not notes[name]:
                    notes[name] = measured(functools.partial(sample, name))[1]
    finally:
        reset_dynamo()
    return {name: (samples[name] if not notes[name] else [], notes[name]) for name in cases}
