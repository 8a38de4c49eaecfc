"""Export the fixture models (fixture_models.py) to ONNX in training mode.

Run with the interpreter that has torch 1.13 (see regenerate.sh):

    python3 export_fixtures.py [--out-dir DIR] [--only NAME ...]

Writes <name>_op13.onnx and <name>_op17.onnx for every model.  The recipe is
the same for every file: seeded construction, train() mode,
TrainingMode.TRAINING, no constant folding, dynamic batch axis on the one
input and the one output.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixture_models as fm  # noqa: E402

OPSETS = (13, 17)
EXAMPLE_BATCH = 2


def export_one(name, opset, path, **extra):
    _, make_input, in_name, out_name = fm.MODELS[name]
    model = fm.build(name)
    model.train()
    x = make_input(EXAMPLE_BATCH)
    torch.onnx.export(
        model,
        (x,),
        path,
        export_params=True,
        opset_version=opset,
        training=torch.onnx.TrainingMode.TRAINING,
        do_constant_folding=False,
        input_names=[in_name],
        output_names=[out_name],
        dynamic_axes={in_name: {0: "batch"}, out_name: {0: "batch"}},
        **extra,
    )
    size = os.path.getsize(path)
    assert size < 2 * 1024 * 1024, f"{path} is {size} bytes (limit 2 MB)"
    return size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    names = args.only or list(fm.MODELS)
    print(f"torch {torch.__version__}")
    for name in names:
        for opset in OPSETS:
            fname = f"{name}_op{opset}.onnx"
            size = export_one(name, opset, os.path.join(args.out_dir, fname))
            print(f"  {fname:24s} {size:9d} bytes")


if __name__ == "__main__":
    main()
