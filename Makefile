# loom's two commands (see README.md):
#   make run   installs what loom needs, builds it, and runs loom's main job
#   make test  installs what loom needs, builds it, and runs every test
# Other targets: build, asan, tsan, fuzz, bench, fresh-check, format, clean.

MAKEFLAGS += --no-print-directory

JOBS    ?= $(shell nproc)
BUILD   ?= build
# Warnings are errors in CI (CI=true) and when asked (WERROR=ON).
WERROR  ?= $(if $(CI),ON,OFF)
FUZZ_SECONDS ?= 60
# Debian's python3, which has python3-numpy and python3-torch.
PYTHON  ?= /usr/bin/python3

CMAKE_CONFIGURE = cmake -S . -DLOOM_WERROR=$(WERROR) -Wno-dev

.PHONY: all deps build run test asan tsan fuzz bench fresh-check format clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	$(CMAKE_CONFIGURE) -B $(BUILD) -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD) -j$(JOBS)

# The main job: trains an MLP classifier on the embedded digits dataset (loom train).
run: build
	./$(BUILD)/loom train

# Every test: the Release build, ASan+UBSan, TSan, and a bounded libFuzzer run.
test: deps
	WERROR=$(WERROR) JOBS=$(JOBS) FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/test.sh

asan: deps
	$(CMAKE_CONFIGURE) -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_SANITIZE=address -DLOOM_BUILD_TOOLS=OFF
	cmake --build build-asan -j$(JOBS)

tsan: deps
	$(CMAKE_CONFIGURE) -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_SANITIZE=thread -DLOOM_BUILD_TOOLS=OFF
	cmake --build build-tsan -j$(JOBS)

fuzz: deps
	CC=clang CXX=clang++ $(CMAKE_CONFIGURE) -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DLOOM_SANITIZE=address -DLOOM_FUZZ=ON -DLOOM_BUILD_TESTS=OFF -DLOOM_BUILD_TOOLS=OFF
	cmake --build build-fuzz -j$(JOBS)

bench: build
	./$(BUILD)/loom bench memory
	./$(BUILD)/loom bench runtime
	./$(BUILD)/loom bench train
	./$(BUILD)/loom bench interop
	./$(BUILD)/loom bench fusion
	@# GPU benchmarks: in builds with the CUDA backend (they report why when no GPU is present).
	if ./$(BUILD)/loom bench cuda --help >/dev/null 2>&1; then ./$(BUILD)/loom bench cuda; fi
	@# all_reduce through loom's communicator vs direct MPI_Allreduce, 2 ranks (MPI builds).
	if ./$(BUILD)/loom bench distributed --help >/dev/null 2>&1; then \
	  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 --oversubscribe \
	    ./$(BUILD)/loom bench distributed; fi
	PYTHONPATH=$(BUILD)/python $(PYTHON) python/bench/dlpack_round_trip.py
	PYTHONPATH=$(BUILD)/python $(PYTHON) python/bench/train_vs_torch.py --loom $(BUILD)/loom
	@# ONNX models (resnet18, mobilenet_v2, a transformer stack) against ONNX Runtime, from
	@# npm's onnxruntime-node (bench/onnx), and PyTorch eager, at batch 1 and 32, 1 and 2 threads.
	cd bench/onnx && npm ci --ignore-scripts --no-audit --no-fund
	PYTHONPATH=$(BUILD)/python $(PYTHON) python/bench/onnx_vs_ort.py --models-dir $(BUILD)/onnx-models \
	  --json $(BUILD)/onnx-bench.json

# Do the install steps hold on a fresh Debian 12 machine? (scripts/fresh-check.sh; needs root)
fresh-check:
	scripts/fresh-check.sh

format:
	clang-format -i $$(git ls-files '*.hpp' '*.cpp' '*.h' '*.c')

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz
