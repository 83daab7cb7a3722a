#!/usr/bin/env bash
# The GPU half of loom, checked on the GPU of this machine (docs/cuda.md, "Checking a GPU").
#
#   scripts/gpu-check.sh OUT [--build-dir DIR] [--deps DIR] [--prebuilt DIR] [--quick] [--no-bench]
#
# From a clean checkout: configures a Release build with Ninja in DIR (default build-gpu) and
# builds only what the check needs (the library, the gpu-labelled tests, the loom tool, the
# Python extension against $PYTHON, default the python3 on PATH); then runs
#   1. ctest -L gpu (every CUDA test; the cross-backend test on its own, with its JSON report),
#   2. the GPU pytest files with the PyTorch, CuPy and Numba installed for $PYTHON, and the
#      docs' code blocks that need a GPU (tests/docs/doc_blocks.py),
#   3. loom train (the MLP, and one epoch of the CNN), placed by loom on the GPU,
#   4. loom bench cuda --json, and its PyTorch companion (python/bench/cuda_vs_torch.py) on
#      the same GPU,
# writes every log and JSON under OUT, and prints a short table last. Without a GPU every
# step still runs: the tests skip saying why and the benchmarks report that no GPU is present.
#
# --prebuilt DIR   take the C++ binaries from DIR (a build tree of these sources made on
#                  another machine: same absolute path, same CUDA major version) when they
#                  run here, and build only the Python extension here, against DIR's
#                  libloom.a; when they do not run, build everything as above.
# --deps DIR       .deb files of loom's build libraries (scripts/install-deps.sh --download
#                  DIR makes them) for a machine that cannot install Debian's packages: they
#                  are unpacked into the build folder's name + "-deps" and found there.
# Exits non-zero when a test failed or a step could not run.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# shellcheck source=scripts/ctest-summary.sh
. scripts/ctest-summary.sh

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 1 ] || usage
out=$1; shift
build=build-gpu
prebuilt=""
debs=""
quick=""
bench=1
while [ $# -gt 0 ]; do
  case $1 in
    --build-dir) build=$2; shift 2 ;;
    --prebuilt) prebuilt=$2; shift 2 ;;
    --deps) debs=$2; shift 2 ;;
    --quick) quick=--quick; shift ;;
    --no-bench) bench=0; shift ;;
    *) usage ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
PYTHON=${PYTHON:-$(command -v python3)}
JOBS=${JOBS:-$(nproc)}

# ---- results: one row per step -------------------------------------------------------------
rows=()
status=0
row() {  # row NAME RESULT DETAIL
  rows+=("$(printf '%-28s %-6s %s' "$1" "$2" "$3")")
  [ "$2" = "FAIL" ] && status=1
  return 0
}
step() { printf '\n== %s ==\n' "$*"; }
elapsed() { echo "$(( $(date +%s) - $1 ))s"; }

# ---- the machine ---------------------------------------------------------------------------
step "machine"
{
  date -u '+%Y-%m-%d %H:%M:%S UTC'
  uname -srm
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 ||
    echo "nvidia-smi: not available"
  command -v nvcc >/dev/null && nvcc --version | tail -n2
  "$PYTHON" - <<'EOF' 2>&1
import importlib, platform
print("python", platform.python_version())
for name in ("numpy", "torch", "cupy", "numba", "pytest"):
    try:
        m = importlib.import_module(name)
        extra = ""
        if name == "torch":
            extra = f" cuda={m.version.cuda} available={m.cuda.is_available()}"
        print(name, getattr(m, "__version__", "?") + extra)
    except Exception as e:  # absent or broken: say which
        print(name, "missing:", type(e).__name__, e)
EOF
} | tee "$out/machine.txt"

# ---- build ---------------------------------------------------------------------------------
deps_args=()
if [ -n "$debs" ]; then
  prefix=$root/$build-deps
  rm -rf "$prefix" && mkdir -p "$prefix"
  for f in "$debs"/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$f" "$prefix"
    else  # a .deb is an ar archive holding data.tar.*
      (f=$(cd "$(dirname "$f")" && pwd)/$(basename "$f"); t=$(mktemp -d) && cd "$t" && ar x "$f" && tar -xf data.tar.* -C "$prefix" && rm -rf "$t")
    fi || { echo "gpu-check: cannot unpack $f"; exit 1; }
  done
  deps_args+=("-DCMAKE_PREFIX_PATH=$prefix/usr")
  export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
python_args=("-DPython3_EXECUTABLE=$PYTHON")
if pybind11_dir=$("$PYTHON" -m pybind11 --cmakedir 2>/dev/null); then
  python_args+=("-Dpybind11_DIR=$pybind11_dir")
fi
gpu_tests=()
for f in tests/cuda/*_test.cpp; do gpu_tests+=("$(basename "${f%.cpp}")"); done

configure_and_build() {  # DIR CMAKE_ARGS... -- TARGETS...
  local dir=$1; shift
  local args=() targets=()
  while [ "$1" != "--" ]; do args+=("$1"); shift; done
  shift; targets=("$@")
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -Wno-dev "${deps_args[@]}" \
        "${python_args[@]}" "${args[@]}" &&
    cmake --build "$dir" -j"$JOBS" --target "${targets[@]}"
}

step "build"
t0=$(date +%s)
if [ -n "$prebuilt" ]; then
  # The probe: do binaries built elsewhere start here (system libraries, driver, CUDA)?
  "$prebuilt/loom" --help >"$out/prebuilt-probe.txt" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    row "prebuilt binaries" ok "$prebuilt/loom runs here"
  else
    tail -n 5 "$out/prebuilt-probe.txt"
    row "prebuilt binaries" no "exit $rc (prebuilt-probe.txt): building here instead"
    prebuilt=""
  fi
fi
if [ -z "$prebuilt" ]; then
  bin=$build
  pydir=$build
  if configure_and_build "$build" -DLOOM_BUILD_PYTHON=ON -- \
       loom_tool loom_python "${gpu_tests[@]}" >"$out/build.log" 2>&1; then
    row build ok "Release, Ninja, $(elapsed "$t0")"
  else
    tail -n 40 "$out/build.log"; row build FAIL "see build.log"
  fi
else
  bin=$prebuilt
  pydir=$build-python
  if configure_and_build "$pydir" -DLOOM_BUILD_PYTHON=ON -DLOOM_BUILD_TESTS=OFF \
       -DLOOM_BUILD_TOOLS=OFF "-DLOOM_PREBUILT_LIBRARY=$root/$bin/src/libloom.a" -- loom_python \
       >"$out/build.log" 2>&1; then
    row "python extension" ok "against $bin/src/libloom.a, $(elapsed "$t0")"
  else
    tail -n 40 "$out/build.log"; row "python extension" FAIL "see build.log"
  fi
fi
"$bin/loom" devices 2>&1 | tee "$out/devices.txt"

# ---- C++ tests -----------------------------------------------------------------------------
ctest_counts() {  # LOG -> "passed/total, N skipped"
  local counts f t skipped
  counts=$(ctest_summary "$1")
  [ -n "$counts" ] || { echo "no summary"; return; }
  read -r f t <<<"$counts"
  skipped=$(grep -cE '\(Skipped\)$' "$1" || true)  # in the list of tests that did not run
  echo "$((t - f))/$t passed, $skipped skipped"
}

step "ctest -L gpu (without the cross-backend test)"
t0=$(date +%s)
ctest --test-dir "$bin" -L gpu -E '^CrossBackend' --output-on-failure -j"$JOBS" --timeout 120 \
      --output-junit "$out/ctest-gpu.xml" >"$out/ctest-gpu.log" 2>&1
rc=$?
tail -n 30 "$out/ctest-gpu.log"
row "ctest -L gpu" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "$(ctest_counts "$out/ctest-gpu.log"), $(elapsed "$t0")"

step "cross-backend test"
t0=$(date +%s)
"$bin/tests/cross_backend_test" --gtest_output="json:$out/cross-backend.json" \
  >"$out/cross-backend.log" 2>&1
rc=$?
tail -n 15 "$out/cross-backend.log"
summary=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' "$out/cross-backend.log" |
          sed -E 's/^\[ *([A-Z]+) *\] ([0-9]+) tests?.*/\2 \1/' | paste -sd, - | tr 'A-Z' 'a-z')
row "cross-backend" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "${summary:-no summary}, $(elapsed "$t0")"

# ---- Python --------------------------------------------------------------------------------
step "pytest (GPU files)"
t0=$(date +%s)
PYTHONPATH="$root/$pydir/python" PYTHONDONTWRITEBYTECODE=1 "$PYTHON" -m pytest -q -p no:cacheprovider \
  -rs --junitxml="$out/pytest-gpu.xml" python/tests/test_cuda_interop.py \
  python/tests/test_cuda_frameworks.py >"$out/pytest-gpu.log" 2>&1
rc=$?
tail -n 25 "$out/pytest-gpu.log"
# pytest exits 5 when it collected nothing: a failure here.
row "pytest GPU files" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "$(tail -n1 "$out/pytest-gpu.log" | tr -d '=' | sed 's/^ *//'), $(elapsed "$t0")"

step "doc blocks that need a GPU (tests/docs/doc_blocks.py)"
# The Python and declaration blocks of the docs that speak of GPUs; those marked as needing a
# GPU run only here. (C/C++ programs need an installed loom: make test builds those.)
PYTHONPATH="$root/$pydir/python" "$PYTHON" tests/docs/doc_blocks.py --loom "$bin/loom" \
  docs/interop.md docs/cuda.md >"$out/doc-blocks.log" 2>&1
rc=$?
tail -n 10 "$out/doc-blocks.log"
row "doc blocks (GPU)" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "$(tail -n1 "$out/doc-blocks.log")"

# ---- loom's main job on the GPU -------------------------------------------------------------
train() {  # NAME LOG ARGS...: loom train, placed by loom (the GPU where kernels exist)
  local name=$1 log=$2; shift 2
  step "$name"
  t0=$(date +%s)
  timeout 600 "$bin/loom" train --quiet "$@" >"$out/$log" 2>&1
  rc=$?
  tail -n 12 "$out/$log"
  local acc sps
  acc=$(awk '/test accuracy/ {print $3}' "$out/$log")
  sps=$(awk '/throughput/ {print $2}' "$out/$log")
  row "$name" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" \
      "test acc ${acc:-?}, ${sps:-?} samples/s, $(elapsed "$t0")"
}
train "loom train (mlp)" train-mlp.log
train "loom train (cnn, 1 epoch)" train-cnn.log --model cnn --epochs 1

# ---- figures -------------------------------------------------------------------------------
if [ $bench -eq 1 ]; then
  step "loom bench cuda"
  t0=$(date +%s)
  if "$bin/loom" bench cuda --json $quick >"$out/bench-cuda.json" 2>"$out/bench-cuda.log"; then
    row "loom bench cuda" ok "bench-cuda.json, $(elapsed "$t0")"
  else
    tail -n 20 "$out/bench-cuda.log"; row "loom bench cuda" FAIL "see bench-cuda.log"
  fi
  step "PyTorch peers on the same GPU"
  t0=$(date +%s)
  PYTHONPATH="$root/$pydir/python" "$PYTHON" python/bench/cuda_vs_torch.py $quick \
    --loom "$bin/loom" --loom-json "$out/bench-cuda.json" --json "$out/torch-peers.json" \
    --loom-train-log "$out/train-mlp.log" \
    >"$out/torch-peers.txt" 2>&1
  rc=$?
  cat "$out/torch-peers.txt"
  case $rc in
    0) row "PyTorch peers" ok "torch-peers.json, $(elapsed "$t0")" ;;
    2) row "PyTorch peers" skip "$(tail -n1 "$out/torch-peers.txt")" ;;
    *) row "PyTorch peers" FAIL "see torch-peers.txt" ;;
  esac
fi

# ---- the table -----------------------------------------------------------------------------
{
  printf '\n%s\n' "gpu-check: $(head -n3 "$out/machine.txt" | tail -n1)"
  printf '%s\n' "${rows[@]}"
  if [ -s "$out/bench-cuda.json" ] || [ -s "$out/torch-peers.json" ]; then
    "$PYTHON" python/bench/cuda_vs_torch.py --table "$out/bench-cuda.json" "$out/torch-peers.json" 2>&1
  fi
} | tee "$out/summary.txt"
exit $status
