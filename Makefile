# nbdist set-up. Two commands on a fresh machine:
#   make demo   creates .venv, installs everything (Horovod included), runs the quickstart end to end
#   make test   the same set-up, then the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# jax, torch: Keras's JAX and PyTorch backends (CPU builds), so the backend tests run too
EXTRAS ?= dev,jax,torch
comma  := ,
STAMP  := $(VENV)/.nbdist-installed-$(subst $(comma),-,$(EXTRAS))
WHEELS ?= $(HOME)/.cache/nbdist/wheels
# The torch extra's pin (pyproject.toml; tests/inproc/test_package.py checks they agree). PyPI's
# Linux torch is the multi-GB CUDA build: where PyTorch's own index is reachable, take its CPU
# build with `make TORCH_INDEX=https://download.pytorch.org/whl/cpu`. Unset (the default, and
# what CI does: its network reaches only the package registries), pip takes the pin as it finds it.
TORCH_PIN   := torch==2.13.0
TORCH_INDEX ?=
PYTEST_ARGS ?=

.PHONY: install system horovod test test-fast demo bench lint clean

install: $(STAMP)

$(STAMP): pyproject.toml nbdist/_kernels.c
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip setuptools wheel
	@# nbdist used to depend on tensorflow-cpu: it shares its folder with `tensorflow`, so go first
	$(BIN)/python -m pip uninstall -q -y tensorflow-cpu 2>/dev/null || true
	@# the torch extra, where TORCH_INDEX is set: that CPU build of the pin first (its +cpu version wins over
	@# PyPI's), so the extra then finds it installed; GPU nodes install the CUDA build before make
	case ',$(EXTRAS),' in *,torch,*) [ -z '$(TORCH_INDEX)' ] || $(BIN)/python -c 'import torch' \
	  2>/dev/null || $(BIN)/python -m pip install '$(TORCH_PIN)' --extra-index-url '$(TORCH_INDEX)';; esac
	$(BIN)/python -m pip install -e '.[$(EXTRAS)]'
	touch $@

# GPU nodes: make test EXTRAS=dev,gpu (or demo, install): TensorFlow's CUDA libraries and NVIDIA's
# management library too; `make horovod` builds NCCL in where the node has a GPU, nvcc and NCCL.

# Debian packages: the Fashion-MNIST files (read offline by nbdist.datasets) and the Horovod
# build's toolchain. Skipped with a message when we are not root and cannot use apt-get.
system:
	bash scripts/system_packages.sh

horovod: system install
	bash scripts/build_horovod.sh $(BIN)/python $(WHEELS)

# The lint first: a few seconds, and the rules the code's markers name hold on every change
test: system install horovod lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The edit loop: the tests that need no cluster (tests/unit, pure; tests/inproc, Keras and
# in-process hubs), less those marked slow (over about 3 s each, measured). make test runs them all.
test-fast: install
	$(BIN)/python -m pytest tests/unit tests/inproc -m "not slow"

demo: system install horovod
	$(BIN)/python scripts/demo.py

# Each benchmark runs nbdist and its baseline in one process run and prints the ratio.
bench: install horovod
	$(BIN)/python benchmarks/overhead.py --overlap
	$(BIN)/python benchmarks/hub_throughput.py
	$(BIN)/python benchmarks/mac_threads.py
	$(BIN)/python benchmarks/update_kernel.py
	$(BIN)/python benchmarks/rules_throughput.py
	$(BIN)/python benchmarks/dbs_effect.py
	$(BIN)/python benchmarks/metrics_overhead.py
	$(BIN)/python benchmarks/sync_vs_async.py
	$(BIN)/python benchmarks/sync_batchnorm.py
	$(BIN)/python benchmarks/augment_gap.py
	$(BIN)/python benchmarks/network.py
	$(BIN)/python benchmarks/peers.py
	$(BIN)/python benchmarks/hub_soak.py
	$(BIN)/python benchmarks/dashboard_refresh.py
	$(BIN)/python benchmarks/reproduce.py
	$(BIN)/python benchmarks/reproduce.py --part overlap
	$(BIN)/python benchmarks/reproduce.py --part pipeline

lint: install
	$(BIN)/ruff check nbdist tests benchmarks scripts

clean:
	rm -rf $(VENV) out build *.egg-info
