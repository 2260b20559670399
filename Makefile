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

# Debian package -> a file that proves it is installed.
# libc6-dev is only a recommendation of gcc: images that skip recommendations lack <stdio.h>.
DEPS_BASE = cmake:/usr/bin/cmake gcc:/usr/bin/gcc libc6-dev:/usr/include/stdio.h make:/usr/bin/make \
            libcmocka-dev:/usr/include/cmocka.h
DEPS_COV  = gcovr:/usr/bin/gcovr
DEPS_FUZZ = clang:/usr/bin/clang

.PHONY: all deps pydeps need-python3 demo test-sim test-cuda fuzz coverage bench install clean plan

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
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS)

$(BUILD)/tpflex: deps $(BUILD)/CMakeCache.txt FORCE
	cmake --build $(BUILD) -j $(JOBS)

FORCE:

demo: $(BUILD)/tpflex
	$(BUILD)/tpflex demo $(DEMO_ARGS)

# The Python package's tests need python3 and torch (a CPU build is enough: they run on the
# simulator). Installed with pip when run as root, like the Debian packages above.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
pydeps:
	@command -v python3 >/dev/null || $(MAKE) --no-print-directory need-python3
	@if ! python3 -c 'import torch' 2>/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "tpflex: installing torch (CPU) for the Python tests"; \
	    python3 -m pip install -q --index-url $(TORCH_INDEX) torch || \
	    python3 -m pip install -q --break-system-packages --index-url $(TORCH_INDEX) torch || exit 1; \
	  else \
	    echo "tpflex: the Python tests need torch"; \
	    echo "run: python3 -m pip install --index-url $(TORCH_INDEX) torch"; exit 1; \
	  fi; \
	fi

need-python3:
	$(call need,python3:/usr/bin/python3 python3-pip:/usr/lib/python3/dist-packages/pip)

# Every test that needs no GPU; ctest prints the count ("100% tests passed, 0 tests failed out of N").
# pydeps may have installed python3 only now, after `make demo` configured the build without it:
# configuring again registers the tests that need it (the CLI test, the Python tests).
test-sim: pydeps $(BUILD)/tpflex
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)
	cd $(BUILD) && ctest --output-on-failure -LE gpu -j $(JOBS) 2>&1

test-cuda:
	$(call need,$(DEPS_BASE))
	cmake -S . -B build-cuda -DTPF_WITH_CUDA=ON $(CMAKE_FLAGS)
	cmake --build build-cuda -j $(JOBS)
	cd build-cuda && CUDA_DEVICE_MAX_CONNECTIONS=32 ctest --output-on-failure -L gpu 2>&1
	@if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then \
	  BUILD=$(CURDIR)/build-cuda OUT=$(CURDIR)/build-cuda/python-gpu bash scripts/gpu_python.sh tests; \
	else echo "tpflex: Python GPU tests skipped (no torch with CUDA)"; fi

fuzz:
	$(call need,$(DEPS_BASE) $(DEPS_FUZZ))
	CC=clang cmake -S . -B build-fuzz -DTPF_FUZZ=ON -DTPF_WITH_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build build-fuzz -j $(JOBS)
	bash fuzz/run.sh build-fuzz $(FUZZ_SECONDS)

coverage:
	$(call need,$(DEPS_BASE) $(DEPS_COV))
	cmake -S . -B build-cov -DTPF_COVERAGE=ON -DTPF_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug $(CMAKE_FLAGS)
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
