# `make test` and `make demo` set themselves up: a virtualenv in $(VENV), the pinned torch first
# (a bare `torch` can pull a multi-GB CUDA build), then this project with its test extras.
PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fxviews-installed

.PHONY: setup test demo bench clean

setup: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==$(TORCH_VERSION)
	$(PY) -m pip install -q -e '.[test,onnx]'
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q -p no:cacheprovider tests

demo: setup
	$(PY) -m fxviews demo

bench: setup
	$(PY) -m fxviews bench

clean:
	rm -rf $(VENV) build *.egg-info
