#!/usr/bin/env bash
# Configures build/ on first use (CUDA is built when nvcc is found), then
# compiles. Extra arguments go to `meson setup` (e.g. -Dcuda=disabled).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f build/build.ninja ] || meson setup build "$@"
# Meson records no header dependencies for CUDA sources (ninja's deps for a
# .cu object are empty), so a changed header would leave objects compiled
# against the old one: a struct of another size, kernel tables read with the
# wrong stride, crashes far from the cause. Any header newer than the oldest
# CUDA object sends every CUDA object to be compiled again.
oldest=$(find build -name '*.cu.o' -printf '%T@ %p\n' 2>/dev/null | sort -n | head -1 | cut -d' ' -f2- || true)
if [ -n "$oldest" ] && [ -n "$(find src onnx tests \( -name '*.h' -o -name '*.cuh' \) -newer "$oldest" -print -quit)" ]; then
  echo "build.sh: headers changed since the CUDA objects were compiled: compiling them again"
  find build -name '*.cu.o' -delete
fi
ninja -C build
