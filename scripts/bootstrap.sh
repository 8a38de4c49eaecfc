#!/usr/bin/env bash
# Installs what gpipe-onnx needs to build and test, non-interactively and
# idempotently (packages already present are left alone).
#
#   scripts/bootstrap.sh              what building and running need (with
#                                     cudnn-frontend's headers for the CUDA
#                                     backend, .cache/cudnn-frontend/)
#   scripts/bootstrap.sh --tests      also the test data and tools: the ONNX
#                                     backend node tests and a Python
#                                     environment with onnxruntime (.cache/)
#   scripts/bootstrap.sh --reference  also PyTorch, ONNX and scikit-learn for
#                                     regenerating fixtures and reference runs
set -euo pipefail

packages=(
  meson ninja-build pkg-config gcc g++
  protobuf-c-compiler libprotobuf-c-dev libonnx-dev
  libcmocka-dev libopenblas-dev
  python3 python3-numpy python3-pip python3-venv
  clang libclang-rt-14-dev   # libFuzzer and the sanitizers' runtimes
  openmpi-bin libopenmpi-dev   # several processes: train --pipeline under mpirun
)
tests=false
case "${1:-}" in
  "") ;;
  --tests) tests=true ;;
  --reference) packages+=(python3-torch python3-onnx python3-torchvision python3-sklearn) ;;
  *) echo "usage: $0 [--tests | --reference]" >&2; exit 2 ;;
esac

here=$(dirname "$0")
fetch_data() {
  # cuDNN's graph API headers: small, and only read when CUDA is built.
  "$here/fetch_cudnn_frontend.sh"
  if $tests; then
    "$here/fetch_onnx_tests.sh"
    "$here/python_env.sh"
  fi
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "bootstrap: all ${#packages[@]} packages present"
  fetch_data
  exit 0
fi

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
echo "bootstrap: installing ${missing[*]}"
# Package lists may be stale or absent on a fresh machine: refresh once on failure.
if ! $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"; then
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
fetch_data
