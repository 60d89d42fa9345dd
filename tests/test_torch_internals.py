"""The private PyTorch internals fxviews relies on: one home, each still there, none elsewhere.

A PyTorch release that moves or renames one of them fails here, with a test id and a message
naming it, before it breaks a user's graph.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import logging
import re
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement  # packaging comes with pytest
from packaging.specifiers import SpecifierSet

import fxviews
import fxviews.passes.compat.torch_internals as internals

REPO = Path(__file__).resolve().parent.parent
# The shipped code: everything in it but the internals module must go through that module.
LIBRARY_DIRS = ("fxviews", "passes")
#: The compat layer: the internals module, its part for releases before 2.13 (whose names it
#: re-exports) and the fake-mode reconciliation.
INTERNALS_FILES = set((REPO / "passes" / "compat").glob("*.py"))
# Namespaces without a leading underscore that PyTorch still keeps out of its stable API.
UNSTABLE_NAMESPACES = ("functorch", "torch.fx.experimental", "torch.fx.passes")


@pytest.mark.parametrize("name", internals.__all__)
def test_every_internal_resolves_through_the_module(name):
    value = getattr(internals, name)  # on-use internals raise ImportError naming what is gone
    assert value is not None, f"torch {torch.__version__} provides {name} as None"


def test_a_missing_on_use_internal_is_named_with_the_supported_range(monkeypatch):
    monkeypatch.setitem(internals._ON_USE, "gone", ("torch.fx", "no_such_internal"))
    with pytest.raises(ImportError) as caught:
        internals.gone  # noqa: B018 (the attribute access is the test)
    message = str(caught.value)
    assert "torch.fx.no_such_internal" in message
    assert torch.__version__ in message
    assert internals.SUPPORTED_TORCH in message


def test_a_missing_import_time_internal_is_named_with_the_supported_range(monkeypatch):
    import torch._functorch.pyfunctorch as pyfunctorch

    monkeypatch.delattr(pyfunctorch, "temporarily_clear_interpreter_stack")
    try:
        with pytest.raises(ImportError) as caught:
            importlib.reload(internals)  # what `import fxviews` runs into on such a release
    finally:
        monkeypatch.undo()
        importlib.reload(internals)
    message = str(caught.value)
    assert "temporarily_clear_interpreter_stack" in message
    assert "torch._functorch.pyfunctorch" in message
    assert internals.SUPPORTED_TORCH in message


def test_a_missing_module_is_named_too(monkeypatch):
    monkeypatch.setitem(internals._ON_USE, "gone", ("torch.no_such_module", "anything"))
    with pytest.raises(ImportError, match=r"torch\.no_such_module\.anything"):
        internals.gone  # noqa: B018


def test_a_missing_aten_operator_is_named():
    with pytest.raises(ImportError, match=r"torch\.ops\.aten\._no_such_op\.default"):
        internals._aten_overload("_no_such_op")


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        internals.no_such_name  # noqa: B018


def test_supported_range_is_the_declared_range_and_holds_this_torch():
    torch_requirements = [
        Requirement(r)
        for r in importlib.metadata.requires("fxviews") or ()
        if Requirement(r).name == "torch"
    ]
    assert [r.specifier for r in torch_requirements] == [SpecifierSet(internals.SUPPORTED_TORCH)]
    release = torch.__version__.split("+")[0]
    assert release in SpecifierSet(internals.SUPPORTED_TORCH), (
        f"the suite runs on torch {release}, outside the declared {internals.SUPPORTED_TORCH}"
    )


def test_ci_tests_both_ends_of_the_range():
    # `make test-oldest-torch` pins OLDEST_TORCH, the range's first release; `make test` pins
    # TORCH_VERSION inside it; `make test-newest-torch` installs NEWEST_TORCH (~=X.Y.0), whose
    # X.Y must be the range's last minor release.
    makefile = (REPO / "Makefile").read_text()
    oldest = re.search(r"^OLDEST_TORCH \?= (\d+)\.(\d+)\.(\d+)$", makefile, re.MULTILINE)
    pinned = re.search(r"^TORCH_VERSION \?= (\d+\.\d+\.\d+)$", makefile, re.MULTILINE)
    newest = re.search(r"^NEWEST_TORCH \?= ~=(\d+)\.(\d+)\.0$", makefile, re.MULTILINE)
    assert oldest and pinned and newest, "the Makefile no longer sets the three torch releases"
    supported = SpecifierSet(internals.SUPPORTED_TORCH)
    assert pinned[1] in supported
    major, minor = int(oldest[1]), int(oldest[2])
    assert oldest[0].split()[-1] in supported
    assert f"{major}.{minor - 1}.99" not in supported, f"{major}.{minor - 1} is in range, untested"
    major, minor = int(newest[1]), int(newest[2])
    assert f"{major}.{minor}.99" in supported
    assert f"{major}.{minor + 1}.0" not in supported, f"{major}.{minor + 1} is in range, untested"


def test_ci_runs_the_oldest_release_with_the_zoo_required():
    # The oldest release's run is the one CI makes of the real models on a torchvision that
    # imports beside its torch: a zoo that fails to import must fail it, not skip.
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile[makefile.index("test-oldest-torch: ") :].split("\n\n")[0]
    assert "FXVIEWS_REQUIRE_ZOO=1 $(OLDEST_PY) -m pytest $(PYTEST_SUITE)" in recipe
    assert "make test-oldest-torch" in (REPO / ".ci" / "run").read_text()


def test_fake_device_mismatches_are_recognised_on_this_release():
    # The tracer falls back to real mode on them (a class of its own from 2.13, a RuntimeError
    # by its message before): a rewording on either side would end that fallback.
    with internals.FakeTensorMode():
        cpu, meta = torch.empty(2), torch.empty(2, device="meta")
        with pytest.raises(RuntimeError) as caught:
            cpu + meta  # noqa: B018
    assert internals.is_fake_device_mismatch(caught.value)
    assert not internals.is_fake_device_mismatch(RuntimeError("Expected all tensors to be"))


@pytest.mark.parametrize("chunk_size", [None, 1, 2, 5, 40])
@pytest.mark.parametrize("shapes", [[(3,)], [(2, 3), (4,)], [(1,), (0,), (2, 2)], [(0,)]], ids=str)
def test_the_traceable_jacobian_basis_is_pytorchs_own(shapes, chunk_size):
    # On every release, against the basis this release's jacrev and jacfwd build eagerly.
    from torch._functorch import eager_transforms

    tensors = [torch.randn(shape, dtype=torch.float64) for shape in shapes]
    numels = [t.numel() for t in tensors]
    expected = list(eager_transforms._chunked_standard_basis_for_(tensors, numels, chunk_size))
    with internals.traceable_jacobian_basis():
        replaced = eager_transforms._chunked_standard_basis_for_
        actual = list(replaced(tensors, numels, chunk_size))
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        for a, b in zip(got, want, strict=True):
            assert (a.shape, a.dtype, a.stride()) == (b.shape, b.dtype, b.stride())
            assert torch.equal(a, b)


def test_the_traceable_jacobian_basis_is_put_back_after_a_failed_trace():
    from torch._functorch import eager_transforms

    original = eager_transforms._chunked_standard_basis_for_
    with pytest.raises(fxviews.FxViewsError):
        fxviews.trace(lambda x: torch.func.jacrev(lambda y: y[: int(y.sum())])(x), torch.ones(3))
    assert eager_transforms._chunked_standard_basis_for_ is original


# Keyword arguments fxviews passes: a rename there breaks a call, not an import.
KEYWORDS = [
    ("make_fx", ("tracing_mode",)),
    ("FakeTensorMode", ("shape_env", "allow_non_fake_inputs")),
    ("FakeTensorProp", ("mode",)),
    ("compile_fx", ("inner_compile", "config_patches", "decompositions")),
]


@pytest.mark.parametrize(("name", "keywords"), KEYWORDS, ids=[k[0] for k in KEYWORDS])
def test_internals_take_the_keywords_fxviews_passes(name, keywords):
    parameters = inspect.signature(getattr(internals, name)).parameters
    missing = [k for k in keywords if k not in parameters]
    assert not missing, f"torch {torch.__version__}: {name} no longer takes {missing}"


def test_inductor_tells_the_inner_compile_hook_which_graph_it_compiles(caplog):
    # The backend names each graph from compile_fx_inner's is_backward keyword.
    caplog.set_level(logging.DEBUG, logger="fxviews")
    x = torch.randn(6, requires_grad=True)
    windows = torch.compile(
        lambda t: t.as_strided((4, 3), (1, 1)).sin().sum(),
        backend=fxviews.backend(inner="inductor"),
    )
    windows(x).backward()
    summaries = [r.getMessage() for r in caplog.records if "fxviews: " in r.getMessage()]
    assert any(m.startswith("backend, forward graph") for m in summaries), summaries
    assert any(m.startswith("backend, backward graph") for m in summaries), summaries


def test_the_aot_autograd_cache_switch_exists():
    # config.patch with an unknown key raises; the backend turns this one off.
    with internals.functorch_config.patch(enable_autograd_cache=False):
        assert internals.functorch_config.enable_autograd_cache is False


def test_no_compile_id_outside_a_compilation():
    assert internals.CompileContext.current_compile_id() is None


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_storage_identity_is_shared_by_views_and_never_by_copies(device):
    x = torch.zeros(4, 3, device=device)
    assert internals.storage_identity(x[1:].t()) == internals.storage_identity(x)
    assert internals.storage_identity(x.clone()) != internals.storage_identity(x)
    assert internals.storage_identity(torch.zeros(4, 3, device=device)) != (
        internals.storage_identity(x)
    )


def test_op_schema_reads_names_and_aliasing():
    schema = internals.op_schema(torch.ops.aten.select.int)
    assert [a.name for a in schema.arguments] == ["self", "dim", "index"]
    assert schema.returns[0].alias_info is not None  # a view
    assert internals.op_schema(torch.ops.aten.sin.default).returns[0].alias_info is None


def test_boxed_call_marks_what_make_boxed_func_returns():
    def plain(args):
        return args

    assert not internals.is_boxed_call(plain)
    assert internals.is_boxed_call(internals.make_boxed_func(plain))


def test_disable_current_modes_steps_out_of_fake_mode():
    with internals.FakeTensorMode():
        faked = torch.zeros(2)
        with internals.disable_current_modes():
            real = torch.zeros(2)
    assert type(faked) is not torch.Tensor
    assert type(real) is torch.Tensor


def test_functorch_wrapped_tensors_are_recognised():
    seen = []
    torch.func.vmap(lambda row: seen.append(internals.is_functorch_wrapped_tensor(row)) or row)(
        torch.zeros(2, 3)
    )
    assert seen == [True]
    assert not internals.is_functorch_wrapped_tensor(torch.zeros(3))


# --------------------------------------------------------------------------------------------
# Nothing else touches an internal


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _attribute_chain(node: ast.Attribute) -> tuple[ast.expr, list[str]]:
    """The root expression of ``a.b.c`` and its attribute names, in reading order."""
    names: list[str] = []
    expr: ast.expr = node
    while isinstance(expr, ast.Attribute):
        names.insert(0, expr.attr)
        expr = expr.value
    return expr, names


def _unstable(module: str) -> bool:
    return any(_private(part) for part in module.split(".")) or any(
        module == ns or module.startswith(ns + ".") for ns in UNSTABLE_NAMESPACES
    )


def _private_attribute_use(node: ast.Attribute) -> str | None:
    """What a whole attribute chain touches that is private or unstable, or None."""
    root, names = _attribute_chain(node)
    root_name = root.id if isinstance(root, ast.Name) else "..."
    owned = root_name in ("self", "cls")  # the project's own objects keep private attributes
    path = ".".join([root_name, *names])
    if any(_private(name) for name in names[1 if owned else 0 :]):
        return path
    if root_name == "torch" and _unstable(path):
        return path
    return None


def _private_name_lookup(node: ast.Call) -> str | None:
    """``getattr(x, "_name")`` and its kin, as text, or None."""
    if not (isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr", "setattr")):
        return None
    name = node.args[1] if len(node.args) > 1 else None
    if isinstance(name, ast.Constant) and isinstance(name.value, str) and _private(name.value):
        return f"{node.func.id}(..., {name.value!r})"
    return None


def private_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) for every private or unstable PyTorch name ``source`` touches.

    Private: an import from a module path with a ``_`` part or of a ``_`` name, an attribute
    ``x._name`` (on anything but ``self``/``cls``), or ``getattr(x, "_name")``; unstable: an
    import from, or attribute path into, the namespaces PyTorch keeps out of its stable API.

    Example::

        >>> private_uses("import torch\\ntorch._dynamo.reset()\\n")
        [(2, 'torch._dynamo.reset')]
    """
    tree = ast.parse(source)
    # Each attribute chain is judged whole, once, from its last attribute.
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    found: list[tuple[int, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if _unstable(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _unstable(node.module):
                found.append((node.lineno, node.module))
            found += [
                (node.lineno, f"{node.module}.{a.name}") for a in node.names if _private(a.name)
            ]
        elif isinstance(node, ast.Attribute) and id(node) not in inner:
            found.append((node.lineno, _private_attribute_use(node)))
        elif isinstance(node, ast.Call):
            found.append((node.lineno, _private_name_lookup(node)))
    return sorted({(line, what) for line, what in found if what is not None})


def test_the_scan_finds_each_kind_of_private_use():
    source = "\n".join(
        [
            "import torch.utils._pytree as pytree",
            "from torch._ops import OpOverload",
            "from torch.autograd import _force_original_view_tracking",
            "from torch.fx.experimental.proxy_tensor import make_fx",
            "x.untyped_storage()._cdata",
            "getattr(f, '_boxed_call', False)",
            "torch.fx.passes.fake_tensor_prop",
            "self._cache, obj.__class__, torch.fx.Graph, from_here",
        ]
    )
    assert [line for line, _ in private_uses(source)] == [1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize(
    "path",
    [p for d in LIBRARY_DIRS for p in sorted((REPO / d).rglob("*.py")) if p not in INTERNALS_FILES],
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_library_modules_reach_internals_only_through_the_internals_module(path):
    uses = private_uses(path.read_text())
    assert not uses, (
        f"{path.relative_to(REPO)} touches PyTorch internals directly: "
        + ", ".join(f"line {line}: {what}" for line, what in uses)
        + ". Add them to passes/compat/torch_internals.py (with what they are for and since which "
        "release) and import them from there."
    )


def test_forget_static_evaluations_makes_a_new_guard_an_axiom():
    """A proof asked before a guard was recorded must see it once asked again (the backend
    proves in Dynamo's graph, then in AOTAutograd's, which adds guards in between)."""
    from torch._dynamo.source import ConstantSource

    env = internals.ShapeEnv()
    size = env.create_symintnode(env.create_symbol(5, ConstantSource("n")), hint=5)
    not_one = (size - 1) != 1
    assert not internals.statically_known_true(not_one)  # any n >= 2 may be 2
    assert bool(not_one)  # at the hint: records the guard n - 1 != 1
    internals.forget_static_evaluations(env)
    assert internals.statically_known_true(not_one)


def test_functorch_layers_a_failed_trace_left_are_popped_and_undone():
    """Before torch 2.13 PyTorch's own undo popped each layer twice (an internal assert on the
    last one); the stack must end at the depth asked for, and torch.func work after it."""
    from torch._C import _functorch

    depth = internals.functorch_layer_depth()
    _functorch._vmap_increment_nesting(3, "error")
    _functorch._grad_increment_nesting()
    _functorch._vmap_increment_nesting(2, "error")
    internals.pop_functorch_layers_to(depth)
    assert internals.functorch_layer_depth() == depth
    x = torch.arange(6.0).reshape(3, 2)
    torch.testing.assert_close(
        torch.func.vmap(torch.func.grad(lambda r: r.sin().sum()))(x), x.cos()
    )


def test_inductors_roll_is_laid_out_as_eagers():
    """Before torch 2.13 Inductor's table decomposed roll into an index_select made contiguous,
    where eager's roll keeps channels_last; the table the backend gives Inductor must give
    eager's layout (an as_strided over it reads that memory)."""
    from torch._inductor.decomposition import select_decomp_table

    table = internals.inductor_decompositions() or select_decomp_table()
    x = torch.arange(100.0).reshape(2, 5, 2, 5).to(memory_format=torch.channels_last)
    decomposed = internals.make_fx(lambda t: torch.roll(t, -1, 0), decomposition_table=table)(x)
    assert decomposed(x).stride() == torch.roll(x, -1, 0).stride()
    torch.testing.assert_close(decomposed(x), torch.roll(x, -1, 0))
