#!/usr/bin/env bash
# Configures build/ on first use (CUDA is built when nvcc is found), then
# compiles. Extra arguments go to `meson setup` (e.g. -Dcuda=disabled).
set -euo pipefail
cd "$(dirname "$0")/.."
# Meson before 1.3 gives nvcc no -MD, so ninja knows no header a CUDA
# object includes, and a changed header would leave objects compiled
# against the old one: a struct of another size, kernel tables read with the
# wrong stride, crashes far from the cause. A build configured here compiles
# CUDA through scripts/nvcc-deps, which writes the depfile ninja reads, so
# `ninja -C build` alone rebuilds what a header change touches.
if [ ! -f build/build.ninja ]; then
  native=()
  if command -v nvcc >/dev/null; then
    mkdir -p .cache
    printf "[binaries]\ncuda = '%s'\n" "$PWD/scripts/nvcc-deps" > .cache/nvcc-deps.ini
    native=(--native-file .cache/nvcc-deps.ini)
  fi
  meson setup build "${native[@]}" "$@"
fi
# For a build configured otherwise (before this, or by hand): any header
# newer than the oldest CUDA object sends every CUDA object to be compiled
# again.
if ! grep -q 'nvcc-deps' build/build.ninja; then
  oldest=$(find build -name '*.cu.o' -printf '%T@ %p\n' 2>/dev/null | sort -n | head -1 | cut -d' ' -f2- || true)
  if [ -n "$oldest" ] && [ -n "$(find src onnx tests \( -name '*.h' -o -name '*.cuh' \) -newer "$oldest" -print -quit)" ]; then
    echo "build.sh: headers changed since the CUDA objects were compiled: compiling them again"
    echo "build.sh: (a build configured by this script tracks them: rm -rf build once to get one)"
    find build -name '*.cu.o' -delete
  fi
fi
ninja -C build
