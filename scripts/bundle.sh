#!/usr/bin/env bash
# Packs a build's binaries for a GPU machine that has the NVIDIA driver,
# CUDA and cuDNN but not this project's build packages: gpipe-onnx, the
# GPU test binaries (tests/test_cuda_*, test_state, test_conv_choices),
# stripped, and the shared libraries they load that come from the build
# machine's packages (OpenBLAS, libgfortran, libquadmath, cmocka), into one
# xz archive of build/ and lib/.
#
#   scripts/bundle.sh [BUILD_DIR] [OUT]   (default: build, BUILD_DIR/bundle.tar.xz)
#
# On the GPU machine, in a checkout of the same commit (the tests read
# their fixtures from the source tree):
#
#   tar xJf bundle.tar.xz
#   export LD_LIBRARY_PATH=$PWD/lib GP_SOURCE_ROOT=$PWD GP_BUILD_ROOT=$PWD/build
#   scripts/cuda_tests.sh build
#
# BUNDLE_TESTS=0 packs gpipe-onnx alone (benchmarks only: a few MB, not
# ~800 MB before compression). xz runs on one thread: several threads
# compress each block alone, and the test binaries, which share most of
# their code, then take three times the space.
set -euo pipefail
cd "$(dirname "$0")/.."

build=${1:-build}
out=${2:-$build/bundle.tar.xz}
[ -x "$build/src/gpipe-onnx" ] || { echo "bundle.sh: no $build/src/gpipe-onnx (run scripts/build.sh)" >&2; exit 2; }
command -v xz >/dev/null || { echo "bundle.sh: xz not found" >&2; exit 2; }
out_dir=$(dirname "$out")
if ! [ -d "$out_dir" ] || ! [ -w "$out_dir" ]; then
    echo "bundle.sh: cannot write into $out_dir" >&2
    exit 2
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage" "$out.tmp"' EXIT
mkdir -p "$stage/build/src" "$stage/build/tests" "$stage/lib"
bins=("$build/src/gpipe-onnx")
if [ "${BUNDLE_TESTS:-1}" != 0 ]; then
    for t in "$build"/tests/test_cuda_* "$build/tests/test_state" "$build/tests/test_conv_choices"; do
        [ -f "$t" ] && [ -x "$t" ] && bins+=("$t")
    done
fi
for b in "${bins[@]}"; do
    dest="$stage/build/${b#"$build"/}"
    cp "$b" "$dest"
    strip "$dest" 2>/dev/null || true
done

# The libraries of the build machine's packages that a CUDA machine lacks:
# what ldd resolves for any binary, by name.
deps=$(ldd "${bins[@]}" 2>/dev/null || true)
missing=0
for name in libopenblas libgfortran libquadmath libcmocka; do
    path=$(awk -v n="$name" '$1 ~ "^" n "[.]so" && $3 ~ "^/" && !p {print $3; p = 1}' <<< "$deps")
    if [ -n "$path" ]; then
        cp -L "$path" "$stage/lib/$(basename "$path")"
    elif grep -q "$name.*not found" <<< "$deps"; then
        echo "bundle.sh: $name is needed but not found here" >&2
        missing=1
    fi
done
[ $missing = 0 ] || exit 1

echo "bundle.sh: ${#bins[@]} binaries and $(find "$stage/lib" -type f | wc -l) libraries, $(du -sh "$stage" | cut -f1) before compression"
tar cf - -C "$stage" build lib | xz -T1 --lzma2=preset=6,dict=256MiB > "$out.tmp"
mv "$out.tmp" "$out"
echo "bundle.sh: wrote $out ($(du -h "$out" | cut -f1))"
