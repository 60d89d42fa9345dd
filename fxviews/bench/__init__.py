"""``python -m fxviews bench``: the benchmarks of fxviews, run side by side in one process.

Thirteen tables, each a set of timings taken in this run with ratios beside them (ratios measured
in one process on one machine are what compare; absolute times move with the machine). The
timers are :mod:`fxviews.bench.timing`'s; this module builds what they time:

1. ``vmap``        vmap over the rewritten graph of ``push_jvp`` vs a per-sample Python
                   loop of eager ``push_jvp``, eager ``vmap(push_jvp)`` and
                   ``vmap(fxviews.transform(push_jvp))``.
2. ``graph``       the rewritten graph vs the original graph, same contiguous inputs, no vmap.
3. ``first_call``  first call of ``transform(fn)`` vs first call of ``torch.compile(fn)`` with
                   ``aot_eager`` and with the default backend, on a fresh function.
4. ``pass_cost``   the engine's cost vs graph size, per node and as a fraction of make_fx.
5. ``overhead``    a cached ``transform`` call vs its graph's ``forward`` returning ``fn``'s
                   output tree and returning a flat list, called directly and under ``vmap``.
6. ``compile``     compile time of ``backend="fxviews"`` vs ``aot_eager``.
7. ``compiled``    ``vmap(push_jvp)`` under ``torch.compile`` (Inductor, ``aot_eager``,
                   ``fxviews`` with inner eager and inner Inductor) vs ``vmap(transform)``:
                   steady-state call, first call, and after how many calls a compile pays.
8. ``models``      per-sample gradients and jvp of whole models (small ones written here: a
                   ViT, a ResNet, a MobileNet, ``nn.TransformerEncoder``; the zoo with
                   ``fxviews[zoo]``: torchvision's ResNet-18 and MobileNetV3, timm's ViT-Tiny)
                   under ``vmap``: eager vs ``transform`` vs ``aot_eager``, first call (with
                   fxviews' share of it) and steady state.
9. ``startup``     ``import fxviews`` over ``import torch``, and ``python -m fxviews --help``,
                   in fresh interpreters.
10. ``memory``     peak memory of ``transform``'s first call vs eager on a large input, called
                   directly and under ``vmap``, in fresh interpreters.
11. ``user_as_strided`` research programs that write their own ``as_strided`` (im2col,
                   log-mel, Hankel, Takens, windows) under ``vmap`` and ``vmap(grad)``,
                   compiled: ``backend="fxviews"`` vs Inductor and ``aot_eager``.
12. ``small``      programs of a few ops each (a KV-cache write, rotary embeddings, a GRU step,
                   an optimizer step, a window sum, ...) under ``vmap``, B=3: ``transform``
                   vs eager, steady-state call and first call.
13. ``compiled_models`` whole models compiled (Longformer's sliding-chunk attention, a cache
                   read by chunks, a Toeplitz layer, an im2col convolution, GPT-2 blocks), eval
                   and a training step: ``fxviews`` vs Inductor and ``aot_eager``, steady state
                   and first compile, median and worst.

Rows 1, 4 and 5 and the steady states of rows 7, 11, 12 and 13 report the minimum CPU time over
interleaved repeats, which resolves the microseconds they compare on a loaded machine; rows 2
and 3 the median wall time. The first calls of rows 6 and 7 report CPU time beside wall time
and, in the full run, time each compile in a fresh interpreter (Note [Cold compiles]). torch
runs on one thread unless ``--threads`` says otherwise, so that timings do not depend on how
busy the other cores are. A row whose dependency cannot run here prints ``n/a (reason)``
instead of a number; a measured path that raises prints ``n/a (error: ...)`` and makes the run
exit with status 1.

The package, by job: :mod:`~fxviews.bench.cli` (options, the run, the registry of rows),
``rows_runtime`` (rows 1, 2, 5), ``rows_engine`` (row 4), ``rows_compile`` (rows 3, 6, 7, 11),
``rows_models``, ``models`` and ``zoo`` (row 8 and its models), ``rows_first_hour`` (rows 9
and 10), ``rows_small`` and ``small_programs`` (row 12 and its programs),
``rows_compiled_models`` and ``compiled_models`` (row 13 and its models), ``workloads`` (the
functions measured), ``compile_paths`` and ``cold`` (compiled paths and their first calls in
fresh interpreters), ``timing`` (the timers), ``report`` (cells and tables), ``output`` (the
progress line, PyTorch's warnings collected) and ``plots`` (``--plot``'s charts).
``bench --help`` prints :data:`~fxviews.bench.cli.DESCRIPTION`, not this docstring.
"""

from fxviews.bench.cli import BENCHES, DESCRIPTION, ROWS, add_arguments, main, run, run_rows

__all__ = ["BENCHES", "DESCRIPTION", "ROWS", "add_arguments", "main", "run", "run_rows"]
