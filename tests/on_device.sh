#!/usr/bin/env bash
# The one prepared run on a machine with a GPU (docs/testing.md): the differential tests with
# their samples on the device, then the bench's device rows there, logs in one folder.
#
#   tests/on_device.sh LOGDIR                # cuda, python3 and its own torch
#   DEVICE=cuda:1 PYTHON=.venv/bin/python tests/on_device.sh LOGDIR
#   DEVICE=cpu WORKERS=2 BENCH_ARGS='--quick --rows vmap' tests/on_device.sh LOGDIR
#
# LOGDIR (default $OUT, a lent machine's folder that comes back; none: the terminal only)
# receives preflight.log, device-tests.log, device-tests.xml (JUnit), bench.log, bench.json
# and summary.txt. fxviews is imported from this source tree, no install. The machine's Python
# needs torch in fxviews' supported range; what a GPU image lacks of the rest (tabulate, and
# pytest, pytest-xdist, pytest-timeout, hypothesis, expecttest with their dependencies) is
# pure Python: `make device-wheels` downloads those wheels into .device-wheels/, and this
# script unpacks whatever wheels WHEELS (default .device-wheels) holds onto its path. A
# preflight names anything still missing in one line, before any test runs.
#
# Options, from the environment: WORKERS (pytest-xdist processes; default: the CPU count, at
# most 16; 0: one process), PYTEST_ARGS (replaces the default pytest options), BENCH_ARGS
# (default --quick; empty: the full device bench, Inductor included), BENCH=0 (tests only),
# TESTS_TIMEOUT (seconds for the whole test stage, default 480, so the bench still runs).
# The exit status is the tests' if they failed, else the bench's.
set -uo pipefail
cd "$(dirname "$0")/.."

# The files whose tests build their samples with tests/reference.py, so run on $DEVICE.
TESTS=(
    tests/test_engine_differential.py
    tests/test_pass_differential.py
    tests/test_opinfo_views.py
    tests/test_transform.py
    tests/test_modes_inside_fn.py
    tests/test_real_programs.py
    tests/test_kept_nodes.py
    tests/test_guards_and_state.py
    tests/test_layout_truth.py
    tests/test_device_faults.py
)
python=${PYTHON:-python3}
device=${DEVICE:-cuda}
logs=${1:-${OUT:-}}
export FXVIEWS_TEST_DEVICE=$device
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [[ -n "$logs" ]]; then
    mkdir -p "$logs" || exit 2
fi

# Writes stdin to the terminal and, where there is a log folder, to $logs/$1.
log_to() {
    if [[ -n "$logs" ]]; then tee "$logs/$1"; else cat; fi
}

# Carried wheels: pure-Python ones unpack to importable trees (a wheel is a zip of them).
wheels=${WHEELS:-.device-wheels}
if compgen -G "$wheels/*.whl" >/dev/null; then
    site=$(mktemp -d)
    trap 'rm -rf "$site"' EXIT
    for wheel in "$wheels"/*.whl; do
        "$python" -m zipfile -e "$wheel" "$site" || exit 2
    done
    export PYTHONPATH="$PYTHONPATH:$site"
fi

cpus=$(nproc 2>/dev/null || echo 2)
workers=${WORKERS:-$((cpus < 16 ? cpus : 16))}

"$python" - "$workers" <<'PREFLIGHT' 2>&1 | log_to preflight.log
import importlib
import os
import platform
import sys

# What the run imports, by the name pip knows it by.
needed = {
    "tabulate": "tabulate",
    "pytest": "pytest",
    "hypothesis": "hypothesis",
    "expecttest": "expecttest",
    "pytest_timeout": "pytest-timeout",
}
if int(sys.argv[1]) > 0:
    needed["xdist"] = "pytest-xdist"
missing = []
for module, package in needed.items():
    try:
        importlib.import_module(module)
    except ImportError as err:
        missing.append(f"{package} ({err})" if err.name != module else package)
try:
    import torch
except ImportError:
    sys.exit(f"preflight: python {platform.python_version()} has no torch")
where = f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda})"
if missing:
    sys.exit(
        f"preflight: {where} lacks {', '.join(missing)}: carry their pure-Python wheels in "
        ".device-wheels (make device-wheels) or WHEELS=DIR"
    )
try:
    import fxviews  # noqa: F401 - refuses a torch outside its supported range, naming it
    from tests.reference import TEST_DEVICE as device  # refuses a device this machine lacks
except (ImportError, RuntimeError) as err:
    sys.exit(f"preflight: {where}: {type(err).__name__}: {err}")
name = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
print(f"preflight: {where}; FXVIEWS_TEST_DEVICE={os.environ['FXVIEWS_TEST_DEVICE']}: {device}"
      f"{name}; {os.cpu_count()} cpus, {sys.argv[1]} pytest workers")
PREFLIGHT
preflight=$?
if ((preflight != 0)); then
    echo "on_device: preflight failed (exit $preflight); nothing ran" | log_to summary.txt
    exit "$preflight"
fi

default_pytest="-q -p no:cacheprovider -rfE --timeout 600"
if ((workers > 0)); then
    default_pytest+=" -n $workers --dist load --max-worker-restart 0"
fi
if [[ -n "$logs" ]]; then
    default_pytest+=" --junitxml $logs/device-tests.xml"
fi
read -r -a pytest_args <<<"${PYTEST_ARGS:-$default_pytest}"
start=$SECONDS
timeout --signal=INT --kill-after=30 "${TESTS_TIMEOUT:-480}" \
    "$python" -m pytest "${pytest_args[@]}" "${TESTS[@]}" 2>&1 | log_to device-tests.log
tests=$?
tests_s=$((SECONDS - start))

bench=0
bench_s=0
if [[ "${BENCH:-1}" != 0 ]]; then
    read -r -a bench_args <<<"${BENCH_ARGS---quick}"
    json=()
    if [[ -n "$logs" ]]; then json=(--json "$logs/bench.json"); fi
    start=$SECONDS
    "$python" -m fxviews bench --device "$device" "${bench_args[@]}" "${json[@]}" 2>&1 |
        log_to bench.log
    bench=$?
    bench_s=$((SECONDS - start))
fi

echo "on_device: device tests exit $tests in ${tests_s} s; bench exit $bench in ${bench_s} s" \
    "(device $device, $workers workers)${logs:+; logs in $logs}" | log_to summary.txt
if ((tests != 0)); then exit "$tests"; fi
exit "$bench"
