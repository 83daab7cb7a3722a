#!/usr/bin/env bash
# Installs the Debian packages loom needs, once: packages already installed are skipped,
# and nothing runs when all are present. Uses sudo when not root.
#
#   scripts/install-deps.sh                 install what is missing
#   scripts/install-deps.sh --download DIR  download the build libraries (the -dev packages
#       below and the run-time packages they need beyond a C++ toolchain) as .deb files into
#       DIR, for a machine that cannot install Debian's packages (scripts/gpu-check.sh --deps)
set -euo pipefail

# The libraries loom builds against.
libraries=(
  libfmt-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev
  libdnnl-dev libdlpack-dev   # oneDNN (CPU matmul, convolution, pooling); DLPack's header
  # oneDNN's dnnl-config.cmake calls find_package(OpenCL); Debian's libdnnl-dev only
  # recommends the package that provides it, and recommends are not installed here.
  ocl-icd-opencl-dev
  # ONNX import (loom_onnx): ONNX's C++ library; its headers include protobuf's, which
  # libonnx-dev does not depend on.
  libonnx-dev libprotobuf-dev
  # Collectives and processes (loom::distributed): Open MPI's library; mpirun is in
  # openmpi-bin, below.
  libopenmpi-dev
)
# What those need at run time or from their headers, beyond a C++ toolchain (--download).
library_runtime=(libfmt9 libdnnl2 ocl-icd-libopencl1 opencl-c-headers opencl-clhpp-headers
                 libonnx1 libonnxifi libprotobuf32 libprotobuf-lite32 zlib1g-dev
                 libopenmpi3 openmpi-common)

packages=(
  build-essential cmake make pkg-config
  ninja-build                # scripts/gpu-check.sh builds with Ninja
  ccache                     # the builds compile through it (CMakeLists.txt, LOOM_CCACHE)
  "${libraries[@]}"
  clang libclang-rt-14-dev   # libFuzzer and the sanitizer runtimes for the fuzz build
  libomp-dev                 # OpenMP for clang (the fuzz build links oneDNN's OpenMP users)
  python3
  # The Python package: pybind11 against Debian's python3 and NumPy; pytest and PyTorch
  # for its tests (zero-copy exchange is tested against both).
  python3-dev pybind11-dev python3-numpy python3-pytest python3-torch
  python3-pip python3-venv   # pip install ./python, tested in a virtual environment
  chromium                   # the memory report pages, opened headless by their test
  # ONNX models (docs/onnx.md): python3-onnx's backend test runner and case generators run
  # the conformance suite (tests/onnx/conformance.py); torchvision's models, exported by
  # torch.onnx, are the parity tests' and benchmarks' models (python/bench/onnx_models.py).
  python3-onnx python3-torchvision
  openmpi-bin                # mpirun: the multi-process tests (docs/distributed.md)
)

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi

if [ "${1:-}" = "--download" ]; then
  dir=${2:?usage: install-deps.sh --download DIR}
  mkdir -p "$dir"
  $sudo apt-get update -qq
  # apt's sandbox user must be able to write there; download to a folder of its own first.
  tmp=$(mktemp -d)
  chmod 777 "$tmp"
  (cd "$tmp" && apt-get download -qq "${libraries[@]}" "${library_runtime[@]}")
  mv "$tmp"/*.deb "$dir"/
  rmdir "$tmp"
  ls "$dir"
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
# The ONNX Runtime peer (bench/onnx, `npm ci --ignore-scripts` there): Node.js and npm.
# A Node.js that brings its own npm (NodeSource's package does, and conflicts with Debian's
# npm) is kept; Debian's nodejs and npm are installed only where npm is missing.
if ! command -v npm >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
