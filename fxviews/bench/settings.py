"""What the bench measures with: its settings (``--quick`` or the full run) and its tables."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

#: A JSON-ready table: one dict per printed line, the same keys in every dict.
Table = list[dict[str, Any]]

#: Row 7's batch (vmap of push_jvp, compiled); here so the rows' titles need no row imported.
COMPILED_BATCH = 256
#: Row 8's samples per batch (each sample an image or 16 tokens).
MODELS_BATCH = 8
#: Row 11's samples per batch (research programs with their own as_strided, compiled).
USER_AS_STRIDED_BATCH = 64


@dataclass(frozen=True)
class Settings:
    """How hard to measure: ``--quick`` trades precision for a run of about a minute (two and a
    half with the zoo of row 8 installed, ``fxviews[zoo]``)."""

    repeats: int  # repeats of a timed call (rows 1 and 7 take three times as many, half as long)
    min_repeat_seconds: float  # each repeat loops a call until it takes at least this long
    batch_sizes: tuple[int, ...]
    graph_nodes: tuple[int, ...]  # approximate node counts of the row-4 graphs
    compile_repeats: int  # first calls, compiles and row 4's traces take seconds: fewer repeats
    default_backend: bool  # Inductor compiles for many seconds; --quick leaves it out
    dense_views: int = 1_000  # views of one base in row 4's as_strided-dense graph (0: none)
    # Rows 6 and 7 time each compile in a fresh interpreter, this many per path, the paths
    # alternating (0: in this process instead, compile_repeats after a warm-up).
    cold_compiles: int = 0
    big_graph_repeats: int = 1  # passes timed on row 4's 100k-node graph (seconds each)
    # Row 8's models: the ones written in fxviews.bench.models, then the zoo (fxviews[zoo]).
    models: tuple[str, ...] = (
        "vit", "resnet", "mobilenet", "encoder", "resnet18", "mobilenet_v3_small", "vit_tiny"
    )  # fmt: skip
    zoo_image_side: int = 64  # the zoo's images in row 8 (a multiple of 16, for the ViT)
    # Row 12's programs (fxviews.bench.small_programs), by name; None: every one.
    small_programs: tuple[str, ...] | None = None
    # Row 13's models (fxviews.bench.compiled_models), by name; None: every one.
    compiled_models: tuple[str, ...] | None = None
    memory_mb: int = 256  # row 10's input: push_jvp's three tensors, this many MB in all
    compiled_batch: int = COMPILED_BATCH  # row 7's batch
    models_batch: int = MODELS_BATCH  # row 8's samples per batch
    # Where the rows' tensors and models live: None for the CPU bench, whose steady states are
    # CPU time; a device (``--device``) for wall time with the device synchronised around each
    # timed stretch (see fxviews.bench.timing.steady_seconds).
    device: str | None = None


QUICK = Settings(3, 0.01, (8, 64, 256, 1024), (1_000, 10_000), 1, False, 300)
FULL = Settings(
    7,
    0.1,
    (8, 64, 256, 1024),
    (1_000, 10_000, 100_000),
    3,
    True,
    cold_compiles=5,
    big_graph_repeats=3,
    zoo_image_side=112,
    memory_mb=1024,
)


#: Rows 1, 7 and 8's batches on an accelerator (``--device cuda``): at the CPU bench's sizes
#: its work is mostly kernel launches. Row 1's Python loop stops at ``LOOP_LIMIT`` samples.
DEVICE_BATCH_SIZES = (256, 4096, 65536)
DEVICE_COMPILED_BATCH = 65536
DEVICE_MODELS_BATCH = 256
LOOP_LIMIT = 1024


def on_device(settings: Settings, device: str) -> Settings:
    """``settings`` for the rows run with ``--device device``: the device, and on an
    accelerator its batches (on CPU the CPU bench's, so ``--device cpu`` differs from the CPU
    bench by its clock only).

    Example::

        >>> on_device(QUICK, "cuda").models_batch, on_device(QUICK, "cpu").models_batch
        (256, 8)
    """
    if torch.device(device).type == "cpu":
        return dataclasses.replace(settings, device=device)
    return dataclasses.replace(
        settings,
        device=device,
        batch_sizes=DEVICE_BATCH_SIZES,
        compiled_batch=DEVICE_COMPILED_BATCH,
        models_batch=DEVICE_MODELS_BATCH,
    )
