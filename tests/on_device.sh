#!/usr/bin/env bash
# The differential tests with their samples on a device, in one run (docs/testing.md):
#
#   tests/on_device.sh                       # on cuda, with python3 and its torch
#   DEVICE=cuda:1 PYTHON=.venv/bin/python tests/on_device.sh
#
# fxviews is imported from this source tree (no install); the machine's Python needs torch in
# fxviews' supported range and pytest, hypothesis and expecttest (the `test` extra). A check of
# those comes first, so a machine that lacks one says so in a line, not in a collection error
# per file. PYTEST_ARGS replaces the default pytest options (`make test-device` passes its
# workers and timeout). Where $OUT is set (a lent machine's folder that comes back), the log is
# written to $OUT/device-tests.log.
set -euo pipefail
cd "$(dirname "$0")/.."

# The files whose tests build their samples with tests/reference.py, so run on $DEVICE.
TESTS=(
    tests/test_engine_differential.py
    tests/test_pass_differential.py
    tests/test_opinfo_views.py
    tests/test_transform.py
    tests/test_real_programs.py
    tests/test_kept_nodes.py
    tests/test_guards_and_state.py
    tests/test_layout_truth.py
)
python=${PYTHON:-python3}
export FXVIEWS_TEST_DEVICE=${DEVICE:-cuda}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

"$python" - <<'CHECK'
import importlib.util
import os
import sys

import torch

name = os.environ["FXVIEWS_TEST_DEVICE"]
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), FXVIEWS_TEST_DEVICE={name}")
missing = [m for m in ("pytest", "hypothesis", "expecttest") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"this Python lacks {', '.join(missing)}: install fxviews' test extra")
try:
    import fxviews  # noqa: F401 - refuses a torch outside its supported range, naming it
    from tests.reference import TEST_DEVICE as device  # refuses a device this machine lacks
except (ImportError, RuntimeError) as err:
    sys.exit(f"{type(err).__name__}: {err}")
if device.type == "cuda":
    print(f"{device}: {torch.cuda.get_device_name(device)}")
CHECK

read -r -a pytest_args <<<"${PYTEST_ARGS:--q -p no:cacheprovider}"
if [[ -n "${OUT:-}" ]]; then
    "$python" -m pytest "${pytest_args[@]}" "${TESTS[@]}" 2>&1 | tee "$OUT/device-tests.log"
else
    "$python" -m pytest "${pytest_args[@]}" "${TESTS[@]}"
fi
