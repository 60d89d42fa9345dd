"""Whole models written by others through ``transform``, against eager PyTorch per sample.

The bench's zoo (:mod:`fxviews.bench.zoo`: torchvision's ResNet-18 and MobileNetV3-Small,
timm's ViT-Tiny; random init, BatchNorm in eval mode) on small images: per-sample gradients
through ``functional_call`` and ``jvp`` of each, under ``vmap`` with the images' batch dim
physically at every position, must equal the same program run eagerly one sample at a time,
with no eager fallback; and ``transform``'s first trace of each is recorded on a sample
(Note [Recording a real trace]), not a fake-mode trace after a refused recording. Skipped where
torchvision or timm is not installed (the extra ``fxviews[zoo]``) or does not import; failed
there instead under ``FXVIEWS_REQUIRE_ZOO=1`` (:mod:`tests.real_models`).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

import fxviews
from fxviews.bench.models import MODELS, build, program
from fxviews.passes.schema import RECORDED, TRACED_WITH
from fxviews.tracing.capture import capture
from tests.real_models import require_zoo_or_skip
from tests.reference import assert_tree_close, per_sample_reference, stack_batched

# Not pytest.importorskip: a torchvision built for another torch fails to import with a
# RuntimeError, not an ImportError; zoo.unavailable says either reason. Under
# FXVIEWS_REQUIRE_ZOO=1 (CI's zoo virtualenv) that reason fails the module instead.
require_zoo_or_skip("torchvision", "timm")

ZOO = [name for name, spec in MODELS.items() if spec.library]
PROGRAMS = [(name, kind) for name in ZOO for kind in MODELS[name].programs]
IMAGE_SIDE = 32  # two patches a side for the ViT; ResNet and MobileNet pool down to 1x1
BATCH = 3


@functools.cache
def _model(name: str) -> torch.nn.Module:
    return build(name, image_side=IMAGE_SIDE)


def _program(name: str, kind: str) -> tuple[Any, list[tuple[torch.Tensor, ...]]]:
    """The per-sample function and its samples (``(image, label)`` or ``(image, direction)``)."""
    fn, batched = program(name, _model(name), kind, BATCH, IMAGE_SIDE)
    return fn, [tuple(arg[b] for arg in batched) for b in range(BATCH)]


@pytest.mark.parametrize("name, kind", PROGRAMS, ids=lambda value: value)
def test_transform_matches_eager_per_sample(name: str, kind: str) -> None:
    fn, samples = _program(name, kind)
    expected = per_sample_reference(fn, samples)
    tf = fxviews.transform(fn, strict=True)
    for bd in range(samples[0][0].dim() + 1):  # every position of the image's batch dim
        # A label is one number per sample: its batch dim can only be 0.
        in_dims = (bd, 0) if kind == "grads" else (bd, bd)
        actual = torch.func.vmap(tf, in_dims=in_dims)(*stack_batched(samples, in_dims))
        assert_tree_close(actual, expected, rtol=1e-4, atol=1e-5, msg=f"{name} {kind} bd={bd}")
    assert tf.cache_info().eager == 0


@pytest.mark.parametrize("name, kind", PROGRAMS, ids=lambda value: value)
def test_first_trace_is_recorded_on_a_sample(name: str, kind: str) -> None:
    fn, samples = _program(name, kind)
    gm = capture(fn, samples[0], fresh=True, caller="test_zoo", name=f"{name} {kind}")
    assert gm.meta[TRACED_WITH] == RECORDED
