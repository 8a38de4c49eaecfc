"""Export `mlp` and `gpt` with a torch 2.x interpreter (legacy TorchScript
exporter, opset 17), so the fixtures include files from a second exporter
version.  Uses the same module definitions and recipe as export_fixtures.py.

    python export_torch2.py [--out-dir DIR]

Writes mlp_torch2_op17.onnx and gpt_torch2_op17.onnx.
"""
import argparse
import inspect
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_fixtures as ef  # noqa: E402

MODELS = ("mlp", "gpt")
OPSET = 17


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=os.path.dirname(os.path.abspath(__file__)))
    args = ap.parse_args()
    major = int(torch.__version__.split(".")[0])
    if major < 2:
        sys.exit(f"export_torch2.py needs torch >= 2, found {torch.__version__}")
    extra = {}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        extra["dynamo"] = False          # legacy TorchScript-based exporter
    print(f"torch {torch.__version__}")
    warnings.filterwarnings("ignore")
    for name in MODELS:
        fname = f"{name}_torch2_op{OPSET}.onnx"
        size = ef.export_one(name, OPSET, os.path.join(args.out_dir, fname), **extra)
        print(f"  {fname:24s} {size:9d} bytes")


if __name__ == "__main__":
    main()
