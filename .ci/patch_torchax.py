"""Make the installed torchax import beside this torch: a workaround, until a release does.

torchax 0.0.13 (and every release before it) names ATen overloads that torch 2.13 and later no
longer have at import: the named-tensor ones (``aten.prod.dim_Dimname``, ``aten.std.names_dim``,
... 22 lines) and, from torch 2.14, ``aten.cholesky`` and ``aten.qr`` (4 more), so ``import
torchax`` raises ``AttributeError``. Each such line only lists an op for a table (autocast
policies, decompositions to take, a lowering to register); an op this torch lacks can never
reach torchax, so the line can go.

Note: the algorithm. For each line of torchax's sources that names ``torch.ops.aten.NAME`` or
``torch.ops.aten.NAME.OVERLOAD`` this torch does not have, comment the line out. Lines are
edited only in the torchax the running interpreter imports; running it twice changes nothing.

Example (``make test-litert`` runs it in its own virtualenv)::

    python .ci/patch_torchax.py   # prints each file changed and how many lines
"""

from __future__ import annotations

import importlib.util
import pathlib
import re

import torch

OP_REFERENCE = re.compile(r"torch\.ops\.aten\.(\w+)(?:\.(\w+))?")


def missing(name: str, overload: str | None) -> bool:
    """Whether this torch lacks ``aten.name`` (or its ``overload``)."""
    packet = getattr(torch.ops.aten, name, None)
    return packet is None or (overload is not None and not hasattr(packet, overload))


def edit(line: str) -> str:
    """``line`` commented out if it is code naming an op this torch lacks, else as it is."""
    if line.lstrip().startswith("#"):
        return line
    names_missing = any(missing(*m.groups()) for m in OP_REFERENCE.finditer(line))
    return "# " + line if names_missing else line


def patch(root: pathlib.Path) -> dict[str, int]:
    """Comment out each line under ``root`` naming an op this torch lacks; per file, how many."""
    changed = {}
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text().splitlines(keepends=True)
        edited = [edit(line) for line in lines]
        count = sum(old != new for old, new in zip(lines, edited, strict=True))
        if count:
            path.write_text("".join(edited))
            changed[str(path.relative_to(root))] = count
    return changed


def main() -> None:
    spec = importlib.util.find_spec("torchax")
    if spec is None or spec.origin is None:
        raise SystemExit("torchax is not installed")
    for name, count in patch(pathlib.Path(spec.origin).parent).items():
        print(f"torchax/{name}: {count} lines naming ops torch {torch.__version__} lacks")


if __name__ == "__main__":
    main()
