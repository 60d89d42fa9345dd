"""``fxviews.rewrite`` of every ``torch.nn`` module that ``torch.export`` exports.

PyTorch's ModuleInfo database (``module_db``) lists the ``torch.nn`` modules with samples: the
arguments to build each and to call it. For each module, float32 on CPU, each sample builds the
module, exports it on the sample's forward arguments, and rewrites the program; the rewritten
program must be valid (its constructor validates its signature against its graph) and its
``module()`` must return what the module returns on those arguments. A sample that
``torch.export`` itself refuses (or eager PyTorch: a sample wrong in the database) is left
out, and a module all of whose samples PyTorch refuses is skipped with its reasons; nothing
fxviews raises is.

``make test`` takes each module's first sample in eval mode; ``make fuzz``
(:func:`tests.databases.whole_databases`) takes every sample, in training mode too.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import fxviews
from fxviews.passes.compat.torch_internals import module_db
from tests.databases import whole_databases
from tests.reference import assert_tree_close

MODULES = {info.name: info for info in module_db}
MODES = ("eval", "train") if whole_databases() else ("eval",)


def _samples(info: Any, training: bool) -> list[Any]:
    samples = info.module_inputs_func(
        info, device="cpu", dtype=torch.float32, requires_grad=False, training=training
    )
    taken = [s for s in samples if s.forward_input is not None]
    return taken if whole_databases() else taken[:1]


def _outputs(call: Any, forward: Any) -> Any:
    """``call``'s outputs on a sample's forward arguments, the random stream reset first (a
    module such as FractionalMaxPool draws from it)."""
    torch.manual_seed(0)
    return call(*forward.args, **forward.kwargs)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(MODULES))
def test_rewritten_program_returns_the_modules_outputs(name: str, mode: str) -> None:
    info = MODULES[name]
    refused = []
    exported = 0
    for index, sample in enumerate(_samples(info, mode == "train")):
        constructor, forward = sample.constructor_input, sample.forward_input
        module = info.module_cls(*constructor.args, **constructor.kwargs).train(mode == "train")
        if info.is_lazy:  # its parameters take their shapes from its first call
            _outputs(module, forward)
        # On a copy: a training-mode call writes the module's buffers (BatchNorm's running
        # statistics), which the program is exported with.
        try:
            expected = _outputs(copy.deepcopy(module), forward)
        except RuntimeError as err:  # the sample itself is wrong (FractionalMaxPool2d's
            # float64 random samples for a float32 input): nothing to export
            refused.append(f"sample {index}, eager: {_first_line(err)}")
            continue
        try:
            program = torch.export.export(module, tuple(forward.args), dict(forward.kwargs))
        except Exception as err:  # noqa: BLE001 - export's own refusal, of any type
            refused.append(f"sample {index}, torch.export: {_first_line(err)}")
            continue
        exported += 1
        result = fxviews.rewrite(program)
        actual = _outputs(result.exported_program.module(), forward)
        # equal_nan: samples outside a loss's domain (KLDivLoss's log of a negative target)
        assert_tree_close(actual, expected, msg=f"{name} {mode} sample {index}", equal_nan=True)
    if not exported:
        pytest.skip(f"PyTorch refuses every sample of {name}: {'; '.join(refused)}")


def _first_line(err: Exception) -> str:
    return f"{type(err).__name__}: {str(err).strip().splitlines()[0]}"
