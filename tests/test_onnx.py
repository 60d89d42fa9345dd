"""``fxviews.export_onnx``: onnxruntime gives eager's values where the plain export does not.

Needs the ``onnx`` extra (onnx, onnxscript, onnxruntime); skipped without it. The plain
``torch.onnx.export`` is measured too, so the claim that it is wrong stays a measured one.
"""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree
from torch.export import Dim

pytest.importorskip("onnx")
pytest.importorskip("onnxscript")
onnxruntime = pytest.importorskip("onnxruntime")

import fxviews  # noqa: E402
from tests.export_cases import CASE_PARAMS, CASES, ONNX_WRONG, Case  # noqa: E402
from tests.reference import assert_tree_close, make_samples  # noqa: E402

CASE_BY_NAME = {case.name: case for case in CASES}


def _sample(case: Case, seed: int = 0) -> tuple[torch.Tensor, ...]:
    return make_samples(case.shapes, 1, seed=seed, dtype=torch.float32)[0]


def _module(case: Case) -> torch.nn.Module:
    return case.make().float()  # ONNX models are usually float32; so are the samples


def _onnxruntime(onnx_program, args: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """Run the ONNX model in a fresh onnxruntime session on the flattened ``args``."""
    session = onnxruntime.InferenceSession(onnx_program.model_proto.SerializeToString())
    feeds = {
        i.name: a.numpy()
        for i, a in zip(session.get_inputs(), pytree.tree_leaves(args), strict=True)
    }
    return [torch.from_numpy(out) for out in session.run(None, feeds)]


def _eager(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    return pytree.tree_leaves(module(*args))


def _plain(module: torch.nn.Module, args: tuple[torch.Tensor, ...], **options):
    program = torch.export.export(module, args, **options)
    return torch.onnx.export(program, dynamo=True, verbose=False)


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_export_onnx_gives_eager_values(case):
    args = _sample(case)
    onnx_program = fxviews.export_onnx(_module(case), args)
    for seed in (1, 2):  # other values than the example's
        args = _sample(case, seed)
        assert_tree_close(_onnxruntime(onnx_program, args), _eager(_module(case), args))


@pytest.mark.parametrize("name", ONNX_WRONG)
def test_plain_onnx_export_is_wrong_or_fails(name):
    case = CASE_BY_NAME[name]
    args = _sample(case)
    onnx_program = _plain(_module(case), args)
    try:
        actual = _onnxruntime(onnx_program, args)
    except onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument as err:
        assert "Gather" in str(err) and "out of data bounds" in str(err)
        return
    with pytest.raises(AssertionError):
        assert_tree_close(actual, _eager(_module(case), args))


def test_plain_onnx_export_of_the_kept_scatter_fails():
    """ONNX has no lowering for as_strided_scatter; export_onnx brings its own (above)."""
    case = CASE_BY_NAME["backward_scatter"]
    with pytest.raises(torch.onnx.OnnxExporterError, match="as_strided_scatter"):
        _plain(_module(case), _sample(case))


def _scatter_into_transpose(x, src):
    return (x * 2).t().as_strided_scatter(src, (2, 2), (1, 2), 1)


def test_kept_scatter_on_a_transposed_input_is_refused():
    with pytest.raises(fxviews.FxViewsError, match="not provably contiguous"):
        fxviews.export_onnx(_scatter_into_transpose, (torch.randn(4, 2), torch.randn(2, 2)))


def _dynamic_window(x):
    return x.t().as_strided((2, x.shape[0] - 1), (1, 3), 1)


def _dynamic_rows(x):
    return (x + 1).as_strided((x.shape[0] - 1, 3), (3, 1), 3)


class _Module(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def test_dynamic_window_on_transposed_input_is_rewritten_and_right():
    n = Dim("n", min=3, max=64)
    example, other = torch.randn(8, 3), torch.randn(13, 3)
    plain = _plain(_Module(_dynamic_window), (example,), dynamic_shapes=({0: n},))
    (actual,) = _onnxruntime(plain, (other,))
    assert actual.shape == (2, 12)
    with pytest.raises(AssertionError):  # the plain model's values are wrong at n = 13
        assert_tree_close(actual, _dynamic_window(other))
    onnx_program = fxviews.export_onnx(_dynamic_window, (example,), dynamic_shapes=({0: n},))
    for rows in (8, 13, 3):
        x = torch.randn(rows, 3)
        assert_tree_close(_onnxruntime(onnx_program, (x,)), [_dynamic_window(x)])


def _column_as_row(x):
    return x.t()[0].as_strided((3,), (1,), 0)  # reads row 0 through a view of column 0


def test_kept_node_on_a_strided_input_is_refused():
    with pytest.raises(fxviews.FxViewsError, match="not provably contiguous"):
        fxviews.export_onnx(
            _column_as_row, (torch.randn(8, 3),), dynamic_shapes=({0: Dim("n", min=3, max=64)},)
        )


def test_dynamic_window_on_contiguous_input_is_right_at_every_size():
    n = Dim("n", min=3, max=64)
    onnx_program = fxviews.export_onnx(
        _dynamic_rows, (torch.randn(8, 3),), dynamic_shapes=({0: n},)
    )
    for rows in (8, 13, 3):
        x = torch.randn(rows, 3)
        assert_tree_close(_onnxruntime(onnx_program, (x,)), [_dynamic_rows(x)])


def test_exported_program_is_accepted_and_traced_graph_with_dims_is_refused():
    case = CASE_BY_NAME["sliced_window"]
    args = _sample(case)
    program = torch.export.export(_module(case), args)
    onnx_program = fxviews.export_onnx(program)
    assert_tree_close(_onnxruntime(onnx_program, args), _eager(_module(case), args))
    with pytest.raises(ValueError, match="ExportedProgram"):
        fxviews.export_onnx(program, args)
    traced = fxviews.trace(_module(case), *args)
    with pytest.raises(fxviews.FxViewsError, match="baked"):
        fxviews.export_onnx(traced, args, dynamic_shapes=({0: Dim("r", min=2, max=8)},))


def test_strict_refuses_a_kept_node():
    with pytest.raises(fxviews.UnsafeAsStridedError):
        fxviews.export_onnx(
            _column_as_row,
            (torch.randn(8, 3),),
            dynamic_shapes=({0: Dim("n", min=3, max=64)},),
            strict=True,
        )


def _past_the_slice(x):
    return x[:2].as_strided((3,), (1,), 6)  # reads the third row through a view of two


def test_node_reading_past_its_input_is_rewritten_from_its_base():
    """Plain ONNX refuses the read past the slice; fxviews rewrites it from the tensor the slice
    is a view of (method "rebased"), and onnxruntime gives eager's values."""
    x = torch.randn(4, 3)
    plain = _plain(_Module(_past_the_slice), (x,))
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument):
        _onnxruntime(plain, (x,))
    onnx_program = fxviews.export_onnx(_past_the_slice, (x,))
    for seed in (1, 2):
        other = torch.randn(4, 3, generator=torch.Generator().manual_seed(seed))
        assert_tree_close(_onnxruntime(onnx_program, (other,)), [_past_the_slice(other)])


def _overlapping_scatter(x, src):
    return (x + 1).as_strided_scatter(src, (2, 2), (1, 1))  # writes element 1 twice


def test_kept_scatter_writing_an_element_twice_is_refused():
    with pytest.raises(fxviews.FxViewsError, match="twice"):
        fxviews.export_onnx(_overlapping_scatter, (torch.randn(4), torch.randn(2, 2)))
