#!/usr/bin/env bash
# make test: every test loom has, in four builds.
#   1. Release: all tests; then loom installed from it, and examples/cpp built against the
#      installed tree (CMake package and pkg-config) and run; the Python package installed
#      with pip into a fresh virtual environment and examples/python run there; every code
#      block of README.md and docs/*.md checked (tests/docs/doc_blocks.py).
#   2. ASan+UBSan: all tests.
#   3. TSan: the memory, device and runtime tests (pools, adaptors, thread pool and
#      executor are built to be thread-safe), without the CUDA backend (its kernels would
#      be compiled a third time for tests that run on the CPU only).
#   4. Each libFuzzer target (fuzz/*_fuzz.cpp: the BFC pool's alloc/free/trim sequences,
#      the allocation-log parser and replay) for FUZZ_SECONDS.
# Prints one closing line with the totals; exits non-zero when anything failed.
#
# In CI (CI set, as .ci/run does) each build folder is removed once its stage is done
# (LOOM_PRUNE_BUILDS=1; 0 keeps them): the four builds with debug information take several
# GB together, more than a shared CI disk may have free, and a clean clone rebuilds them
# from ccache anyway. Elsewhere they are kept for the next incremental run. The sanitizer
# builds link one shared libloom (src/CMakeLists.txt, LOOM_LIBRARY_TYPE): linked statically
# into each test, the ASan build took 38 GB. Each stage prints the disk space left.
set -uo pipefail
cd "$(dirname "$0")/.."

JOBS=${JOBS:-$(nproc)}
WERROR=${WERROR:-OFF}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
PRUNE=${LOOM_PRUNE_BUILDS:-$([ -n "${CI:-}" ] && echo 1 || echo 0)}
passed=0
failed=0
status=0

step() { printf '\n== %s (%s free on disk) ==\n' "$*" "$(df -h --output=avail . | tail -n 1 | tr -d ' ')"; }
# shellcheck source=scripts/ctest-summary.sh
. scripts/ctest-summary.sh

# run_ctest DIR [ctest args...]: runs ctest, adds its counts to the totals.
run_ctest() {
  local dir=$1; shift
  local log
  log=$(mktemp)
  ${CTEST_WRAP:-} ctest --test-dir "$dir" --output-on-failure -j"$JOBS" --timeout 900 "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local counts f t
  counts=$(ctest_summary "$log")
  if [ -n "$counts" ]; then
    read -r f t <<<"$counts"
    passed=$((passed + t - f))
    failed=$((failed + f))
  fi
  rm -f "$log"
  [ "$rc" -eq 0 ] || status=1
}

# prune DIR: removes a build folder whose stage is done, when PRUNE=1 (CI), printing what
# it freed.
prune() {
  [ "$PRUNE" = 1 ] && [ -d "$1" ] || return 0
  echo "-- removing $1 ($(du -sh "$1" | cut -f1)), its stage done"
  rm -rf "$1"
}

# build DIR [cmake args...] [-- targets...]: configures and builds (only `targets` if given).
build() {
  local dir=$1; shift
  local args=() targets=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do args+=("$1"); shift; done
  [ "${1:-}" = "--" ] && { shift; targets=("$@"); }
  cmake -S . -B "$dir" -DLOOM_WERROR="$WERROR" -Wno-dev "${args[@]}" >/dev/null &&
    cmake --build "$dir" -j"$JOBS" ${targets[@]:+--target "${targets[@]}"}
}

step "Release build"
build build -DCMAKE_BUILD_TYPE=Release || { echo "Release build failed"; exit 1; }
run_ctest build

step "Installed loom: the C++ example built against it (CMake package and pkg-config)"
# cmake --install into build/install; examples/cpp is a project of its own that finds it
# with find_package(loom CONFIG) and, again, through pkg-config. Each build must run and
# check its result.
install_check() {
  local prefix=$PWD/build/install out=build/example
  rm -rf "$prefix" "$out"
  cmake --install build --prefix "$prefix" >/dev/null &&
    cmake -S examples/cpp -B "$out" -DCMAKE_PREFIX_PATH="$prefix" -Wno-dev >/dev/null &&
    cmake --build "$out" -j"$JOBS" >/dev/null && "$out/loom_example" &&
    c++ -std=c++20 -O1 examples/cpp/main.cpp -o "$out/loom_example_pc" \
      $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs loom) &&
    "$out/loom_example_pc"
}
if install_check; then
  passed=$((passed + 1))
else
  echo "installed loom: the example failed"; failed=$((failed + 1)); status=1
fi

step "The Python package: pip install into a fresh virtual environment, the examples there"
# pip builds the extension through python/setup.py, here in the Release build folder
# (LOOM_BUILD_DIR: nothing is compiled twice), and installs it into a virtual environment
# that sees Debian's NumPy and PyTorch. The examples run from outside the source tree and
# check their own results.
venv=$PWD/build/venv
python_install() {
  rm -rf "$venv" python/build python/loom.egg-info
  ${PYTHON:-/usr/bin/python3} -m venv --system-site-packages "$venv" &&
    LOOM_BUILD_DIR=$PWD/build "$venv/bin/pip" install -q --no-build-isolation --no-index ./python
  local rc=$?
  rm -rf python/build python/loom.egg-info
  return $rc
}
if python_install; then
  passed=$((passed + 1))
  outside=$(mktemp -d)
  for example in examples/python/*.py; do
    echo "-- $example"
    if (cd "$outside" && "$venv/bin/python" "$OLDPWD/$example"); then
      passed=$((passed + 1))
    else
      echo "$example failed"; failed=$((failed + 1)); status=1
    fi
  done
  rm -rf "$outside"
else
  echo "the Python package: pip install failed"; failed=$((failed + 1)); status=1
fi

step "Docs: every code block of README.md and docs/*.md (tests/docs/doc_blocks.py)"
if PYTHONPATH=$PWD/build/python ${PYTHON:-/usr/bin/python3} tests/docs/doc_blocks.py \
     --loom build/loom --prefix "$PWD/build/install"; then
  passed=$((passed + 1))
else
  echo "a code block of the docs failed"; failed=$((failed + 1)); status=1
fi
prune build

step "ASan+UBSan build"
build build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_SANITIZE=address -DLOOM_BUILD_TOOLS=OFF ||
  { echo "ASan build failed"; exit 1; }
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_ctest build-asan
prune build-asan

step "TSan build (memory, device and runtime tests)"
# Only the executables of those rooms are built: TSan builds are slow.
tsan_targets=()
for f in tests/memory/*_test.c tests/memory/*_test.cpp tests/device/*_test.cpp tests/runtime/*_test.cpp; do
  [ -e "$f" ] && tsan_targets+=("$(basename "${f%.*}")")
done
build build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_SANITIZE=thread -DLOOM_BUILD_TOOLS=OFF -DLOOM_CUDA=OFF \
      -- "${tsan_targets[@]}" ||
  { echo "TSan build failed"; exit 1; }
# TSan cannot map its shadow memory under the high ASLR entropy of some kernels;
# CTEST_WRAP runs ctest (and so the tests) without address randomisation there.
CTEST_WRAP="setarch $(uname -m) -R" TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  run_ctest build-tsan -L "memory|device|runtime"
prune build-tsan

step "libFuzzer targets, ${FUZZ_SECONDS}s each"
if CC=clang CXX=clang++ build build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_SANITIZE=address \
     -DLOOM_FUZZ=ON -DLOOM_BUILD_TESTS=OFF -DLOOM_BUILD_TOOLS=OFF; then
  for target in build-fuzz/fuzz/*_fuzz; do
    corpus="fuzz/corpus/$(basename "$target")"
    work=$(mktemp -d)
    if "$target" -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 "$work" "$corpus" \
         >"$work.log" 2>&1; then
      passed=$((passed + 1))
      echo "$(basename "$target"): ok ($(grep -E 'stat::number_of_executed_units' "$work.log" | awk '{print $2}') runs)"
    else
      failed=$((failed + 1)); status=1
      tail -n 60 "$work.log"
    fi
    rm -rf "$work" "$work.log"
  done
else
  echo "fuzz build failed"; failed=$((failed + 1)); status=1
fi
prune build-fuzz

printf '\ntests: %d passed, %d failed\n' "$passed" "$failed"
exit "$status"
