#!/usr/bin/env bash
# Fetches the ONNX backend node tests (one folder per test: model.onnx and
# test_data_set_*/{input,output}_K.pb) into .cache/onnx-node-tests/, for the
# forward-conformance test (tests/test_conformance.c).
#
# They ship inside the onnx wheel, so this downloads one pinned wheel with pip
# (hash-checked; the data are the same in every platform's wheel, so one is
# named explicitly) and extracts onnx/backend/test/data/node/ only.
# Idempotent: does nothing when the folder is already complete. Extracts into
# a temporary folder and renames it into place, so an interrupted run never
# leaves a partial tree behind.
#
#   PYTHON   interpreter whose pip is used (default: python3)
set -euo pipefail
cd "$(dirname "$0")/.."

ONNX_VERSION=1.17.0
WHEEL=onnx-1.17.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
WHEEL_SHA256=4a183c6178be001bf398260e5ac2c927dc43e7746e8638d6c05c20e321f8c949
PREFIX=onnx/backend/test/data/node/
DEST=.cache/onnx-node-tests
STAMP="$DEST/.complete"
PYTHON=${PYTHON:-python3}

die() { echo "fetch_onnx_tests.sh: $*" >&2; exit 1; }

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "onnx $ONNX_VERSION" ]; then
    echo "ONNX node tests (onnx $ONNX_VERSION) already in $DEST"
    exit 0
fi

command -v "$PYTHON" >/dev/null 2>&1 || die "needs $PYTHON (with pip) to download the onnx wheel"
"$PYTHON" -m pip --version >/dev/null 2>&1 ||
    die "'$PYTHON -m pip' does not work: install pip (Debian: apt-get install python3-pip)"

mkdir -p .cache
tmp=$(mktemp -d .cache/fetch-onnx-tests.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

echo "downloading onnx $ONNX_VERSION ($WHEEL) with pip"
printf 'onnx==%s --hash=sha256:%s\n' "$ONNX_VERSION" "$WHEEL_SHA256" > "$tmp/requirements.txt"
if ! "$PYTHON" -m pip download --quiet --no-deps --require-hashes --only-binary=:all: \
        --platform manylinux_2_17_x86_64 --python-version 3.11 --implementation cp --abi cp311 \
        -r "$tmp/requirements.txt" -d "$tmp/wheel" >"$tmp/pip.log" 2>&1; then
    cat "$tmp/pip.log" >&2
    die "pip could not download onnx==$ONNX_VERSION (is PyPI reachable?)"
fi
[ -f "$tmp/wheel/$WHEEL" ] || die "pip did not produce $WHEEL"

# A wheel is a zip archive: Python's zipfile extracts it without unzip. Only
# members under PREFIX are written, with the prefix stripped; a member whose
# path would leave the destination is refused.
if ! "$PYTHON" - "$tmp/wheel/$WHEEL" "$PREFIX" "$tmp/node" <<'EOF'
import os, sys, zipfile
wheel, prefix, out = sys.argv[1:]
count = 0
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        if not info.filename.startswith(prefix) or info.is_dir():
            continue
        rel = os.path.normpath(info.filename[len(prefix):])
        if rel.startswith("..") or os.path.isabs(rel):
            sys.exit(f"unsafe path in the wheel: {info.filename}")
        path = os.path.join(out, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with z.open(info) as src, open(path, "wb") as dst:
            dst.write(src.read())
        count += 1
if count == 0:
    sys.exit(f"no files under {prefix} in {wheel}")
print(f"extracted {count} files")
EOF
then
    die "extracting the node tests failed"
fi
n=$(find "$tmp/node" -mindepth 1 -maxdepth 1 -type d -name 'test_*' | wc -l)
[ "$n" -gt 1000 ] || die "only $n test folders extracted; expected more than 1000"
echo "onnx $ONNX_VERSION" > "$tmp/node/.complete"

rm -rf "$DEST"
mv "$tmp/node" "$DEST"
echo "ONNX node tests: $n folders in $DEST"
