# The README's commands. Each target does its own set-up on a fresh machine: creates .venv, installs the
# pinned requirements, builds the extension (CUDA when nvcc is found, else CPU-only), then runs.
PYTHON_BOOT ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
MAX_JOBS    ?= $(shell nproc)
PYTEST_ARGS ?=
# pytest-xdist workers (auto: one per core); 0 runs the tests in the pytest process itself.
TEST_WORKERS ?= auto
BENCH_ARGS  ?=

# torch guesses /usr/local when CUDA_HOME is unset, and the link then fails on -lcudart.
ifeq ($(wildcard /usr/local/cuda/bin/nvcc),/usr/local/cuda/bin/nvcc)
export CUDA_HOME ?= /usr/local/cuda
endif
export MAX_JOBS

.PHONY: all venv build test demo bench clean

all: test

$(VENV)/.requirements-installed: requirements-dev.txt
	test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install --upgrade -r requirements-dev.txt
	touch $@

venv: $(VENV)/.requirements-installed

# Rebuilt only when a source, setup.py or the installed requirements changed.
EXTENSION := torchops/_C.abi3.so
$(EXTENSION): $(VENV)/.requirements-installed setup.py pyproject.toml $(shell find csrc -type f)
	$(PY) -m pip install --no-build-isolation --no-deps -e .
	touch $@

build: venv $(EXTENSION)

test: build
	$(PY) -m pytest tests -n $(TEST_WORKERS) $(PYTEST_ARGS)

demo: build
	$(PY) -m torchops.demo

bench: build
	$(PY) benchmarks/run_all.py $(BENCH_ARGS)

clean:
	rm -rf build *.egg-info torchops/_C*.so torchops/_build_info.json
