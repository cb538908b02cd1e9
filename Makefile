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

.PHONY: all venv build test demo bench example clean

all: test

$(VENV)/.requirements-installed: requirements-dev.txt
	test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install --upgrade -r requirements-dev.txt
	touch $@

venv: $(VENV)/.requirements-installed

# Rebuilt only when a source, setup.py or the installed requirements changed. (The Python module _C is linked
# last, after torchops/lib/libtorchops.so, which holds the ops.)
EXTENSION := torchops/_C.abi3.so
$(EXTENSION): $(VENV)/.requirements-installed setup.py pyproject.toml scripts/gen_ops_header.py $(shell find csrc -type f)
	$(PY) -m pip install --no-build-isolation --no-deps -e .
	touch $@

build: venv $(EXTENSION)

test: build
	$(PY) -m pytest tests -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

demo: build
	$(PY) -m torchops.demo

bench: build
	$(PY) benchmarks/run_all.py $(BENCH_ARGS)

# The C++ example (examples/cpp): built with cmake and ninja from the venv, run on CPU (and CUDA with a GPU),
# its outputs compared with Python's.
EXAMPLE_DIR := build/example
example: build
	PATH="$(abspath $(VENV))/bin:$$PATH" cmake -S examples/cpp -B $(EXAMPLE_DIR) -G Ninja $$($(PY) -m torchops.cmake_args)
	PATH="$(abspath $(VENV))/bin:$$PATH" cmake --build $(EXAMPLE_DIR)
	$(PY) examples/cpp/export_and_check.py --example $(EXAMPLE_DIR)/torchops_example --workdir $(EXAMPLE_DIR)/work

clean:
	rm -rf build *.egg-info torchops/_C*.so torchops/lib torchops/_build_info.json torchops/include/torchops/ops.h
