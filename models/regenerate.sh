#!/bin/sh
# Regenerate every fixture in models/: ONNX exports, digits dataset, reference
# training runs (float32 and bf16 autocast), manifest.
#
#   TORCH_PY   interpreter with torch 1.13, sklearn, numpy, onnx
#              (default: /usr/bin/python3, Debian's python3-torch)
#   TORCH2_PY  interpreter with torch >= 2 and onnx; optional. Default:
#              models/.venv-torch2/bin/python if it exists. When unavailable the
#              *_torch2_op17.onnx files already present are kept as they are.
#   ORT_PY     interpreter with onnx, onnxruntime, numpy (default: python3)
set -eu
cd "$(dirname "$0")"

TORCH_PY=${TORCH_PY:-/usr/bin/python3}
TORCH2_PY=${TORCH2_PY:-.venv-torch2/bin/python}
ORT_PY=${ORT_PY:-python3}

echo "== torch 1.13 exports ($TORCH_PY)"
"$TORCH_PY" export_fixtures.py

echo "== the tied-weight GPT, tests/data/tied_gpt_op17.onnx ($TORCH_PY)"
"$TORCH_PY" export_tied.py

echo "== digits dataset ($TORCH_PY)"
"$TORCH_PY" make_digits.py

echo "== default training recipe in the digits models' metadata ($TORCH_PY)"
"$TORCH_PY" add_train_defaults.py

echo "== torch 2.x exports ($TORCH2_PY)"
if command -v "$TORCH2_PY" >/dev/null 2>&1 &&
   "$TORCH2_PY" -c 'import sys, torch, onnx; sys.exit(int(torch.__version__.split(".")[0]) < 2)' 2>/dev/null; then
    "$TORCH2_PY" export_torch2.py
else
    echo "   skipped: no torch>=2 interpreter at TORCH2_PY; keeping existing *_torch2_*.onnx"
fi

echo "== PyTorch reference training runs ($TORCH_PY)"
"$TORCH_PY" make_reference.py

echo "== PyTorch bf16 autocast reference runs ($TORCH_PY)"
"$TORCH_PY" make_reference_bf16.py

echo "== manifest ($ORT_PY)"
"$ORT_PY" record_manifest.py

rm -rf __pycache__
