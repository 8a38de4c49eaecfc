#!/usr/bin/env bash
# Creates .cache/venv with the Python packages that reference checks use
# (onnxruntime, onnx, numpy; pinned), from PyPI. Idempotent. The product
# never needs Python: only tests that compare against onnxruntime do, and
# they skip when this environment is absent.
#
#   PYTHON   interpreter to create the environment with (default: python3)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.cache/venv
PACKAGES=(onnxruntime==1.20.1 onnx==1.17.0 numpy==1.26.4)
STAMP="$VENV/.complete"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "${PACKAGES[*]}" ]; then
    echo "python environment ready in $VENV"
    exit 0
fi
# The stamp is written last: an interrupted run is redone from scratch.
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV" || { echo "python_env.sh: '$PYTHON -m venv' failed (install python3-venv)" >&2; exit 1; }
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "${PACKAGES[@]}"
echo "${PACKAGES[*]}" >"$STAMP"
echo "python environment ready in $VENV"
