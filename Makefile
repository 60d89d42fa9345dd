# `make test` and `make demo` set themselves up: a virtualenv in $(VENV), the pinned torch first
# (a bare `torch` can pull a multi-GB CUDA build), then this project with the extras its tests use.
PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fxviews-installed
# `make demo` needs torch and fxviews only: its own stamp installs just those into $(VENV)
# (16 packages, about 1 GB, nearly all torch); `make test` adds its tests' extras to the same one.
DEMO_STAMP := $(VENV)/.fxviews-demo-installed
# `make test-newest-torch`: the whole suite again, in its own virtualenv, on the newest torch
# release the declared range allows (the newest patch of the last minor release in it).
NEWEST_VENV ?= .venv-newest-torch
NEWEST_TORCH ?= ~=2.15.0
NEWEST_PY := $(NEWEST_VENV)/bin/python
NEWEST_STAMP := $(NEWEST_VENV)/.fxviews-installed
# `make test-oldest-torch`: the whole suite again, in its own virtualenv, on the oldest torch
# release the declared range allows, with the torchvision built for it and timm (the zoo extra),
# so the real-model tests run on a pair that imports together (FXVIEWS_REQUIRE_ZOO=1: they fail
# rather than skip where the zoo does not import), and the client libraries of
# tests/test_clients.py (the clients extra: laplace-torch and nngeometry need that torchvision).
OLDEST_VENV ?= .venv-oldest-torch
OLDEST_TORCH ?= 2.11.0
OLDEST_TORCHVISION ?= 0.26.0
OLDEST_PY := $(OLDEST_VENV)/bin/python
OLDEST_STAMP := $(OLDEST_VENV)/.fxviews-installed

.PHONY: setup lint test test-device device-wheels test-oldest-torch test-newest-torch test-litert demo bench fuzz clean

setup: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

# Not the zoo (fxviews[zoo]): the torchvision built for torch 2.13.0 on the package index is a
# CUDA build, which fails to import beside the CPU torch installed here ("operator
# torchvision::nms does not exist"), and timm imports torchvision. The real-model tests run in a
# virtualenv whose torch and torchvision come from one index and import together, under
# FXVIEWS_REQUIRE_ZOO=1, where a skipped one fails the run (tests/real_models.py).
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==$(TORCH_VERSION)
	$(PY) -m pip install -q -e '.[test,onnx,bench,lint,executorch,openvino,iree,tvm]'
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==$(TORCH_VERSION)
	$(PY) -m pip install -q -e .
	touch $(DEMO_STAMP)

# `make lint`: ruff's lint rules and formatting, and mypy, over the whole tree (settings in
# pyproject.toml). `make test`, and so CI, runs it first. mypy reads the package as installed,
# the engine as fxviews/passes: $(TYPECHECK) is that tree made of links to the sources (mypy's
# paths there are the repository's, passes/ read as fxviews/passes/).
TYPECHECK := build/typecheck

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/fxviews
	ln -s $(CURDIR)/fxviews/* $(TYPECHECK)/fxviews/
	ln -s $(CURDIR)/passes $(TYPECHECK)/fxviews/passes
	cd $(TYPECHECK) && $(CURDIR)/$(VENV)/bin/mypy --config-file $(CURDIR)/pyproject.toml

# The suite runs in TEST_WORKERS processes (pytest-xdist; 0: one process), each given whole
# files, so a file's cached traces and module-scoped fixtures are built once. A crashed worker
# ends the run (xdist's loadfile scheduling can wait forever for a replaced worker), and a
# test running over TEST_TIMEOUT seconds fails with every thread's stack (pytest-timeout).
TEST_WORKERS ?= 2
TEST_TIMEOUT ?= 900
PYTEST_OPTIONS := -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile \
	--max-worker-restart 0 --timeout $(TEST_TIMEOUT)
PYTEST_SUITE := $(PYTEST_OPTIONS) tests

test: lint
	$(PY) -m pytest $(PYTEST_SUITE)

# `make test-device DEVICE=cuda` (or cuda:1, ...): the differential tests (the files listed in
# tests/on_device.sh) with their samples on DEVICE, through FXVIEWS_TEST_DEVICE, in $(VENV). A
# device this machine lacks fails the preflight, saying so; the rest of the suite is
# `make test`'s, on CPU. tests/on_device.sh LOGDIR alone also runs the bench's device rows.
DEVICE ?= cuda

test-device: setup
	DEVICE=$(DEVICE) PYTHON=$(PY) PYTEST_ARGS='$(PYTEST_OPTIONS)' BENCH=0 TESTS_TIMEOUT=0 \
		tests/on_device.sh

# `make device-wheels`: the pure-Python wheels tests/on_device.sh needs beyond torch, for a
# GPU machine's own Python 3.12 where nothing can be installed: carried in .device-wheels/,
# unpacked onto the path by the script.
DEVICE_WHEELS := tabulate pytest pluggy iniconfig packaging pygments hypothesis \
	sortedcontainers expecttest pytest-xdist execnet pytest-timeout

device-wheels:
	$(PYTHON) -m pip download -q --only-binary=:all: --python-version 3.12 \
		--implementation py --abi none --platform any -d .device-wheels $(DEVICE_WHEELS)

# `make fuzz`: every property of the geometry, pass-differential and symbolic suites draws
# FUZZ_EXAMPLES random cases (8 properties: 24k at the default; the backend's random writes
# draw a fifth of that, each a compile) and the fixed differential corpora run too. `make test`
# draws 300 per property (100 for the symbolic one, whose traces are slow; 12 of the backend's
# writes; under CI=1, the same ones on every run). The tests that sweep PyTorch's OpInfo
# and ModuleInfo databases take part of them in `make test` (a fixed share of the ops, each
# module's first sample) and all of them here (FXVIEWS_WHOLE_DATABASES=1, tests/databases.py).
FUZZ_EXAMPLES ?= 3000
FUZZ_TESTS := tests/test_geometry.py tests/test_pass_differential.py \
	tests/test_engine_differential.py tests/test_opinfo_views.py \
	tests/test_symbolic_properties.py tests/test_opinfo_transform.py \
	tests/test_opinfo_steps.py tests/test_export_modules.py tests/test_backend_writes.py

fuzz: setup
	FXVIEWS_EXAMPLES=$(FUZZ_EXAMPLES) FXVIEWS_WHOLE_DATABASES=1 $(PY) -m pytest -q \
		-p no:cacheprovider --hypothesis-show-statistics $(FUZZ_TESTS)

$(NEWEST_PY):
	$(PYTHON) -m venv $(NEWEST_VENV)

# One pip call, so torch and fxviews resolve together. A machine's pip configuration may cap
# torch with a global constraints file (to keep everyday installs on local wheels): an empty
# constraints file in PIP_CONSTRAINT (pip ignores an empty value) lifts that cap for this call
# only, and changes nothing where there is none.
$(NEWEST_STAMP): pyproject.toml | $(NEWEST_PY)
	$(NEWEST_PY) -m pip install -q --upgrade pip
	PIP_CONSTRAINT=/dev/null $(NEWEST_PY) -m pip install -q 'torch$(NEWEST_TORCH)' -e '.[test]'
	touch $(NEWEST_STAMP)

test-newest-torch: $(NEWEST_STAMP)
	$(NEWEST_PY) -c 'import torch; print("torch", torch.__version__)'
	$(NEWEST_PY) -m pytest $(PYTEST_SUITE)

$(OLDEST_PY):
	$(PYTHON) -m venv $(OLDEST_VENV)

# One pip call, so torch, torchvision, the client libraries and fxviews resolve together.
$(OLDEST_STAMP): pyproject.toml | $(OLDEST_PY)
	$(OLDEST_PY) -m pip install -q --upgrade pip
	$(OLDEST_PY) -m pip install -q torch==$(OLDEST_TORCH) torchvision==$(OLDEST_TORCHVISION) \
		-e '.[test,zoo,clients]'
	touch $(OLDEST_STAMP)

test-oldest-torch: $(OLDEST_STAMP)
	$(OLDEST_PY) -c 'import torch, torchvision; print(torch.__version__, torchvision.__version__)'
	FXVIEWS_REQUIRE_ZOO=1 $(OLDEST_PY) -m pytest $(PYTEST_SUITE)

# `make test-litert`: the LiteRT and JAX (torchax) runtimes' tests and docs/runtimes.md's
# recipes, in a virtualenv of their own. litert-torch caps torch below 2.15 and (through xdsl)
# typing_extensions below 4.13, which the main one cannot take; it brings JAX, so torchax costs
# 116 kB more. torchax 0.0.13 does not import beside torch 2.13-2.15 as released:
# .ci/patch_torchax.py comments out its lines naming ops this torch lacks (docs/runtimes.md).
LITERT_VENV ?= .venv-litert
LITERT_PY := $(LITERT_VENV)/bin/python
LITERT_STAMP := $(LITERT_VENV)/.fxviews-installed

$(LITERT_PY):
	$(PYTHON) -m venv $(LITERT_VENV)

$(LITERT_STAMP): pyproject.toml | $(LITERT_PY)
	$(LITERT_PY) -m pip install -q --upgrade pip
	$(LITERT_PY) -m pip install -q torch==$(TORCH_VERSION) -e '.[test,litert,jax]'
	$(LITERT_PY) .ci/patch_torchax.py
	touch $(LITERT_STAMP)

test-litert: $(LITERT_STAMP)
	$(LITERT_PY) -m pytest -q -p no:cacheprovider tests/test_runtimes.py tests/test_readme.py \
		-k 'litert or jax or runtimes.md'

demo: $(DEMO_STAMP)
	$(PY) -m fxviews demo

bench: setup
	$(PY) -m fxviews bench

clean:
	rm -rf $(VENV) $(OLDEST_VENV) $(NEWEST_VENV) $(LITERT_VENV) .device-wheels build *.egg-info
