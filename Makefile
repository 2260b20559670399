# A thin driver over CMake. `make demo` and `make test-sim` work on a fresh Debian/Ubuntu
# machine: missing packages are installed with apt-get when run as root; otherwise the exact
# command to run is printed.

BUILD        ?= build
CMAKE_FLAGS  ?=
JOBS         ?= $(shell nproc 2>/dev/null || echo 2)
FUZZ_SECONDS ?= 60
DEMO_ARGS    ?=
BENCH_ARGS   ?= --backend sim
PREFIX       ?= /usr/local

# The Python interpreter of the Python tests, and the one `pydeps` installs torch into: the active
# venv's ($VIRTUAL_ENV), else python3 on PATH (itself a venv's when one is first on PATH). Every
# configure below passes it to CMake as sys.executable says it (-DPython3_EXECUTABLE=), so an
# interpreter cached by an earlier configure cannot win. Override: make test-sim PYTHON=/path/python3.
PYTHON  ?= $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV)/bin/python3,python3)
PY_EXE   = $(shell $(PYTHON) -c 'import sys; print(sys.executable)' 2>/dev/null)
PY_FLAG  = $(if $(PY_EXE),-DPython3_EXECUTABLE=$(PY_EXE))
# build/ (all, demo, test-sim, bench, plan, install) is configured without the CUDA backend, which
# none of them runs by default: CMAKE_FLAGS=-DTPF_WITH_CUDA=ON (or AUTO) builds it in (it comes
# after, so it wins); a build folder keeps what it was first configured with. test-cuda uses
# build-cuda with -DTPF_WITH_CUDA=ON.
BUILD_FLAGS = -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTPF_WITH_CUDA=OFF

# Debian package -> a file that proves it is installed.
# libc6-dev is only a recommendation of gcc: images that skip recommendations lack <stdio.h>.
DEPS_BASE = cmake:/usr/bin/cmake gcc:/usr/bin/gcc libc6-dev:/usr/include/stdio.h make:/usr/bin/make \
            libcmocka-dev:/usr/include/cmocka.h
DEPS_COV  = gcovr:/usr/bin/gcovr
DEPS_FUZZ = clang:/usr/bin/clang

.PHONY: all deps pydeps python3-present need-python3 demo test-sim test-cuda fuzz coverage bench install clean plan

all: $(BUILD)/tpflex

define need
	@missing=""; for d in $(1); do p=$${d%%:*}; f=$${d#*:}; [ -e "$$f" ] || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "tpflex: installing$$missing"; \
	    (apt-get install -y -qq $$missing >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq $$missing)) || exit 1; \
	  else \
	    echo "tpflex: missing packages:$$missing"; echo "run: sudo apt-get update && sudo apt-get install -y$$missing"; exit 1; \
	  fi; \
	fi
endef

deps:
	$(call need,$(DEPS_BASE))

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) $(BUILD_FLAGS) $(PY_FLAG) $(CMAKE_FLAGS)

$(BUILD)/tpflex: deps $(BUILD)/CMakeCache.txt FORCE
	cmake --build $(BUILD) -j $(JOBS)

FORCE:

demo: $(BUILD)/tpflex
	$(BUILD)/tpflex demo $(DEMO_ARGS)

# The Python package's tests need python3 and torch (a CPU build is enough: they run on the
# simulator). torch is installed into $(PYTHON): in a venv always (no root needed, no
# --break-system-packages); outside one when run as root (--break-system-packages where the
# interpreter is marked EXTERNALLY-MANAGED, as Debian's is), else the command is printed.
# TORCH_INDEX (the CPU wheels, ~200 MB instead of the CUDA build's ~5 GB) is tried first with a
# short timeout and no retries; when it does not answer, pip's configured index serves torch.
# TORCH_INDEX= (empty) skips it.
TORCH_INDEX         ?= https://download.pytorch.org/whl/cpu
TORCH_INDEX_TIMEOUT ?= 15
pydeps: python3-present
	@py="$(PY_EXE)"; \
	if [ -z "$$py" ]; then echo "tpflex: '$(PYTHON)' does not run"; exit 1; fi; \
	"$$py" -c 'import torch' 2>/dev/null && exit 0; \
	venv=$$("$$py" -c 'import sys; print(int(sys.prefix != sys.base_prefix))'); extra=""; \
	if [ "$$venv" != 1 ]; then \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "tpflex: the Python tests need torch for $$py"; \
	    echo "run: $$py -m pip install torch"; \
	    echo " or: python3 -m venv .venv && . .venv/bin/activate && make test-sim"; exit 1; \
	  fi; \
	  "$$py" -m pip --version >/dev/null 2>&1 || $(MAKE) --no-print-directory need-python3 || exit 1; \
	  "$$py" -c 'import os, sys, sysconfig; p = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"); sys.exit(0 if os.path.exists(p) else 1)' && \
	    extra=--break-system-packages; \
	fi; \
	if [ -n "$(TORCH_INDEX)" ]; then \
	  echo "tpflex: installing torch (CPU wheel) into $$py from $(TORCH_INDEX) ($(TORCH_INDEX_TIMEOUT) s timeout, no retries)"; \
	  log=$$(mktemp); \
	  if "$$py" -m pip install -q $$extra --timeout $(TORCH_INDEX_TIMEOUT) --retries 0 --index-url $(TORCH_INDEX) torch >$$log 2>&1; then \
	    rm -f $$log; exit 0; \
	  fi; \
	  echo "tpflex: $(TORCH_INDEX) did not serve torch (unreachable, or no wheel for this Python): $$(grep -m1 -iE 'error|warning' $$log | cut -c1-200)"; rm -f $$log; \
	fi; \
	echo "tpflex: installing torch into $$py from pip's configured index"; \
	"$$py" -m pip install -q $$extra torch

python3-present:
	@$(PYTHON) -c 'import sys' 2>/dev/null || $(MAKE) --no-print-directory need-python3

need-python3:
	$(call need,python3:/usr/bin/python3 python3-pip:/usr/lib/python3/dist-packages/pip)

# Every test that needs no GPU; ctest prints the count ("100% tests passed, 0 tests failed out of N").
# pydeps may have installed python3 only now, after `make demo` configured the build without it:
# configuring again with the interpreter pydeps checked registers the tests that need it (the CLI
# test, the Python tests); TPF_PYTHON_TESTS=ON makes a missing interpreter an error, and a missing
# torch makes the Python tests fail (never a 100% that left them out).
test-sim: pydeps $(BUILD)/tpflex
	cmake -S . -B $(BUILD) $(PY_FLAG) -DTPF_PYTHON_TESTS=ON $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)
	cd $(BUILD) && ctest --output-on-failure -LE gpu -j $(JOBS) 2>&1

test-cuda:
	$(call need,$(DEPS_BASE))
	cmake -S . -B build-cuda -DTPF_WITH_CUDA=ON $(PY_FLAG) $(CMAKE_FLAGS)
	cmake --build build-cuda -j $(JOBS)
	cd build-cuda && CUDA_DEVICE_MAX_CONNECTIONS=32 ctest --output-on-failure -L gpu 2>&1
	@if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then \
	  BUILD=$(CURDIR)/build-cuda OUT=$(CURDIR)/build-cuda/python-gpu bash scripts/gpu.sh python-tests; \
	else echo "tpflex: Python GPU tests skipped (no torch with CUDA)"; fi

fuzz:
	$(call need,$(DEPS_BASE) $(DEPS_FUZZ))
	CC=clang cmake -S . -B build-fuzz -DTPF_FUZZ=ON -DTPF_WITH_CUDA=OFF $(PY_FLAG) $(CMAKE_FLAGS)
	cmake --build build-fuzz -j $(JOBS)
	bash fuzz/run.sh build-fuzz $(FUZZ_SECONDS)

coverage: pydeps
	$(call need,$(DEPS_BASE) $(DEPS_COV))
	cmake -S . -B build-cov -DTPF_COVERAGE=ON -DTPF_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug $(PY_FLAG) $(CMAKE_FLAGS)
	cmake --build build-cov -j $(JOBS)
	cmake --build build-cov --target coverage

bench: $(BUILD)/tpflex
	$(BUILD)/tpflex bench $(BENCH_ARGS)

plan: $(BUILD)/tpflex
	$(BUILD)/tpflex plan --tp 4 --capacity 4096 --tokens 1000 --hidden 1024 --algo ring --coll rs

install: $(BUILD)/tpflex
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD) build-cuda build-fuzz build-cov build-asan build-tsan
