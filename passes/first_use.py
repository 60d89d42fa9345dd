"""Public names imported on first use, so importing a package costs only what a call needs.

``import fxviews`` and ``import fxviews.passes`` bind their public names to a table instead of
importing the modules that define them: the engine pulls in sympy (through PyTorch's symbolic
shapes) and the run-time engine Dynamo, together seconds that a user who only catches an error,
or asks for ``--help``, should not pay. A package's ``__getattr__`` (PEP 562) calls
:func:`import_on_first_use`, which imports the defining module, binds the name in the package
(later look-ups are plain attribute reads) and returns it.

Example::

    _ON_FIRST_USE = {"Geometry": ".geometry:Geometry", "dtensor": "fxviews.consumers.dtensor"}

    def __getattr__(name):
        return import_on_first_use(globals(), _ON_FIRST_USE, name)
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


def import_on_first_use(namespace: dict[str, Any], table: Mapping[str, str], name: str) -> Any:
    """``name`` from the module ``table`` names, bound in ``namespace`` (a package's globals).

    A table entry is ``"module:attribute"`` or a bare module (the module itself is the value);
    relative module names are resolved against ``namespace["__name__"]``. A name outside the
    table raises AttributeError, as a missing module attribute does.
    """
    package = namespace["__name__"]
    if name not in table:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    module_name, _, attribute = table[name].partition(":")
    module = importlib.import_module(module_name, package=package)
    value = getattr(module, attribute) if attribute else module
    namespace[name] = value
    return value


def names_with_first_use(namespace: dict[str, Any], table: Mapping[str, str]) -> list[str]:
    """A package's ``__dir__``: the names bound in ``namespace`` and those ``table`` imports."""
    return sorted(set(namespace) | set(table))
