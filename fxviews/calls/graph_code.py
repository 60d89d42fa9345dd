"""Python code for a graph fxviews only runs (the transform's cached graph), written directly.

Note [The code of a graph only run]
-----------------------------------
FX generates a module's ``forward`` from its graph with a general code generator: readable
names, every argument rendered back as source, annotations and comments. For a small program's
graph that is a large part of the first call (150 us for a two-op graph, 350 us for ten ops,
bench row 12), and the code it writes reaches each op through a module attribute
(``torch.mul``) and builds its tuples of slices anew on every call. The transform's graph is
never shown as code, only run, so its code is written here, node by node:

1. **Names by position.** Input ``i`` is ``a<i>``, the result of node ``i`` is ``v<i>``; a
   global is named after what it holds (``_mm_3``).
2. **Values as themselves.** A call's target, and every argument value other than a node, an
   int, a bool, a string, None or a finite float (written as their exact ``repr``), is a global
   of the code bound to the object itself: no value is rendered as source, so none can come
   back as another (``inf``, a dtype, a memory format). A tuple holding no node and no list is
   one such global, built once (it cannot change); a list is built on every call, as FX's code
   builds it, since a callee may keep or change it.
3. **Python's own syntax** for ``operator.getitem`` (``x[i]``) and method calls
   (``x.name(...)``); a ``get_attr`` reads ``self.<target>`` (the module's attribute, as FX's
   code reads it).
4. **Freed after the last use,** as FX's code frees them (a result nothing reads, at once): a
   large intermediate does not live to the end of the call.
5. **Tracebacks** show the line that raised: the source is registered with ``linecache`` for
   as long as a function of it lives. A source compiles once (its text names no object, so a
   graph traced again for new sizes writes the same text; 256 texts are kept).

A graph with anything else (a ``call_module`` node, an input with a default or a ``*`` input, a
code generator other than FX's plain one, such as make_fx's pytree convention, a dict argument)
runs FX's own code. Either way the function computes what ``gm.forward`` computes; the
module's FX code itself is still generated whenever something reads ``gm.code``.

Checked: ``tests/test_opinfo_steps.py`` runs the graph of every OpInfo sample (float32, CPU;
a fixed share under ``make test``, all under ``make fuzz``) through this code and through
FX's, on the traced sample, on another and under ``vmap``, and requires the same results bit
for bit (or the same error); ``tests/test_graph_code.py`` checks each rule above.

Example::

    >>> forward = run_only_forward(gm)
    >>> torch.equal(forward(x)[0], gm(x)[0])
    True
"""

from __future__ import annotations

import collections
import functools
import itertools
import linecache
import math
import operator
import re
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from fxviews.passes.compat.torch_internals import has_plain_codegen

__all__ = ["run_only_forward"]

#: Argument values written as their ``repr``, which Python reads back as the same value.
_LITERAL_TYPES = (int, bool, str, type(None))
#: Numbers the names of the generated functions in tracebacks.
_serial = itertools.count()


def run_only_forward(gm: torch.fx.GraphModule) -> Callable[..., Any]:
    """``gm.forward``, with code written as the Note says where the graph allows it (else FX's).

    Example::

        >>> run_only_forward(gm)(x)
    """
    try:
        source, names = _Writer(gm.graph).write()
    except _Unsupported:
        return gm.forward
    code, filename = _compiled(source)
    namespace = dict(names)
    exec(code, namespace)  # noqa: S102 - source written above
    function = namespace["forward"]
    if not _functions_of[filename]:
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    _functions_of[filename] += 1
    weakref.finalize(function, _function_died, filename)
    return types.MethodType(function, gm)


#: How many functions of each compiled source live: its lines stay in linecache while any does.
_functions_of: collections.Counter[str] = collections.Counter()


def _function_died(filename: str) -> None:
    _functions_of[filename] -= 1
    if not _functions_of[filename]:
        del _functions_of[filename]
        linecache.cache.pop(filename, None)


@functools.lru_cache(maxsize=256)
def _compiled(source: str) -> tuple[types.CodeType, str]:
    """The code of ``source`` and the name it goes by in tracebacks, compiled once per text:
    a function traced again for new sizes or layouts, or transformed again, writes the same
    source (the objects it calls are globals of each function, not part of the text)."""
    filename = f"<fxviews graph {next(_serial)}>"
    return compile(source, filename, "exec"), filename


class _Unsupported(Exception):  # noqa: N818 - a signal inside this module
    pass


class _Writer:
    """Writes one graph's ``forward`` source and the globals it reads (see the Note)."""

    def __init__(self, graph: torch.fx.Graph) -> None:
        if not has_plain_codegen(graph):
            raise _Unsupported
        self.graph = graph
        self.local: dict[torch.fx.Node, str] = {}
        self.globals: dict[str, Any] = {}

    def write(self) -> tuple[str, dict[str, Any]]:
        nodes = list(self.graph.nodes)
        last_user = {value: node for node in nodes for value in node.all_input_nodes}
        freed: dict[torch.fx.Node, list[torch.fx.Node]] = {}
        for value, user in last_user.items():
            freed.setdefault(user, []).append(value)
        inputs, lines = [], []
        for position, node in enumerate(nodes):
            if node.op == "placeholder":
                if node.args or node.target.startswith("*"):
                    raise _Unsupported  # a default, or *args: FX's code handles those
                self.local[node] = f"a{position}"
                inputs.append(self.local[node])
                continue
            if node.op == "output":
                lines.append(f"return {self._value(node.args[0])}")
                break
            self.local[node] = f"v{position}"
            lines.append(f"{self.local[node]} = {self._call(node)}")
            # What this node read last, and its own result if nothing reads it.
            dead = [*freed.get(node, ()), *([] if node.users else [node])]
            if dead:
                lines.append(" = ".join(self.local[value] for value in dead) + " = None")
        header = f"def forward({', '.join(['self', *inputs])}):\n"
        return header + "".join(f"    {line}\n" for line in lines), self.globals

    def _call(self, node: torch.fx.Node) -> str:
        if node.op == "get_attr":
            return f"self.{node.target}"
        arguments = [self._value(a) for a in node.args]
        arguments += [f"{name}={self._value(v)}" for name, v in node.kwargs.items()]
        if node.op == "call_method":
            return f"{arguments[0]}.{node.target}({', '.join(arguments[1:])})"
        if node.op != "call_function":
            raise _Unsupported  # call_module
        if node.target is operator.getitem and len(node.args) == 2 and not node.kwargs:
            return f"{arguments[0]}[{arguments[1]}]"
        return f"{self._global(node.target)}({', '.join(arguments)})"

    def _value(self, value: Any) -> str:
        if isinstance(value, torch.fx.Node):
            return self.local[value]
        if type(value) in _LITERAL_TYPES or (type(value) is float and math.isfinite(value)):
            return repr(value)
        if isinstance(value, tuple) and _fixed(value):
            return self._global(value)
        if isinstance(value, (list, tuple)):
            items = [self._value(item) for item in value]
            if isinstance(value, list):
                return f"[{', '.join(items)}]"
            return f"({''.join(f'{item}, ' for item in items)})"
        if isinstance(value, slice):
            parts = (value.start, value.stop, value.step)
            return f"slice({', '.join(self._value(part) for part in parts)})"
        if isinstance(value, dict):
            raise _Unsupported
        return self._global(value)

    def _global(self, value: Any) -> str:
        # Named after what it holds where it has a name, for the lines a traceback shows.
        readable = re.sub(r"\W", "_", getattr(value, "__name__", None) or type(value).__name__)
        name = f"_{readable}_{len(self.globals)}"
        self.globals[name] = value
        return name


def _fixed(value: Any) -> bool:
    """Whether ``value`` holds no node and nothing that can change (no list, no dict)."""
    if isinstance(value, (torch.fx.Node, list, dict)):
        return False
    if isinstance(value, tuple):
        return all(_fixed(item) for item in value)
    if isinstance(value, slice):
        return all(_fixed(part) for part in (value.start, value.stop, value.step))
    return True
