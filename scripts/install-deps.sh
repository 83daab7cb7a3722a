#!/usr/bin/env bash
# Installs the Debian packages loom needs, once: packages already installed are skipped,
# and nothing runs when all are present. Uses sudo when not root.
set -euo pipefail

packages=(
  build-essential cmake make pkg-config
  libfmt-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev
  libdnnl-dev libdlpack-dev   # oneDNN (CPU matmul, convolution, pooling); DLPack's header
  # oneDNN's dnnl-config.cmake calls find_package(OpenCL); Debian's libdnnl-dev only
  # recommends the package that provides it, and recommends are not installed here.
  ocl-icd-opencl-dev
  clang libclang-rt-14-dev   # libFuzzer and the sanitizer runtimes for the fuzz build
  libomp-dev                 # OpenMP for clang (the fuzz build links oneDNN's OpenMP users)
  python3
  # The Python package: pybind11 against Debian's python3 and NumPy; pytest and PyTorch
  # for its tests (zero-copy exchange is tested against both).
  python3-dev pybind11-dev python3-numpy python3-pytest python3-torch
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
