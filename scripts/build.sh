#!/usr/bin/env bash
# Configures build/ on first use (CUDA is built when nvcc is found), then
# compiles. Extra arguments go to `meson setup` (e.g. -Dcuda=disabled).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f build/build.ninja ] || meson setup build "$@"
ninja -C build
