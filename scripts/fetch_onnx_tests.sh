#!/usr/bin/env bash
# Fetches the ONNX backend node tests (one folder per test: model.onnx and
# test_data_set_*/{input,output}_K.pb) into .cache/onnx-node-tests/, for the
# forward-conformance test (tests/test_conformance.c). They ship inside the
# onnx wheel: scripts/fetch_wheel_part.sh downloads one pinned wheel and
# extracts onnx/backend/test/data/node/ only (idempotent, never partial).
#
#   PYTHON   interpreter whose pip is used (default: python3)
set -euo pipefail
exec "$(dirname "$0")/fetch_wheel_part.sh" onnx==1.17.0 \
    onnx-1.17.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl \
    4a183c6178be001bf398260e5ac2c927dc43e7746e8638d6c05c20e321f8c949 \
    manylinux_2_17_x86_64 onnx/backend/test/data/node/ .cache/onnx-node-tests 5000
