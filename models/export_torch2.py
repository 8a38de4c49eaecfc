"""Export fixtures with a torch 2.x interpreter, so the fixtures include
files from a second exporter version.  Uses the same module definitions and
recipe as export_fixtures.py.

    python export_torch2.py [--out-dir DIR]            # legacy exporter
    python export_torch2.py --dynamo [--out-dir DIR]   # the dynamo exporter

The first writes mlp_torch2_op17.onnx and gpt_torch2_op17.onnx (legacy
TorchScript exporter, opset 17).  --dynamo writes, for resnet, digits_cnn
and gpt, the two forms of torch.onnx.export(..., dynamo=True) (the default
exporter since torch 2.9), both asked for training mode:
  <name>_dynamo_opt.onnx    its default optimize=True, which folds
                            BatchNormalization into Conv and merges equal
                            initializers even in training mode;
  <name>_dynamo.onnx        optimize=False, which keeps them.
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


DYNAMO_MODELS = ("resnet", "digits_cnn", "gpt")


def export_dynamo(out_dir):
    """Both optimize settings of the dynamo exporter, in training mode."""
    import fixture_models as fm
    for name in DYNAMO_MODELS:
        _, make_input, in_name, out_name = fm.MODELS[name]
        for optimize, suffix in ((True, "_dynamo_opt"), (False, "_dynamo")):
            model = fm.build(name)
            model.train()
            path = os.path.join(out_dir, f"{name}{suffix}.onnx")
            try:
                torch.onnx.export(model, (make_input(ef.EXAMPLE_BATCH),), path, dynamo=True,
                                  optimize=optimize, external_data=False,
                                  training=torch.onnx.TrainingMode.TRAINING,
                                  input_names=[in_name], output_names=[out_name],
                                  dynamic_axes={in_name: {0: "batch"}, out_name: {0: "batch"}})
                print(f"  {os.path.basename(path):24s} {os.path.getsize(path):9d} bytes")
            except Exception as e:  # noqa: BLE001 - report every model's outcome
                print(f"  {os.path.basename(path):24s} failed: {type(e).__name__}: {e}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--dynamo", action="store_true",
                    help="export with the dynamo exporter, optimize on and off")
    args = ap.parse_args()
    major = int(torch.__version__.split(".")[0])
    if major < 2:
        sys.exit(f"export_torch2.py needs torch >= 2, found {torch.__version__}")
    extra = {}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        extra["dynamo"] = False          # legacy TorchScript-based exporter
    print(f"torch {torch.__version__}")
    warnings.filterwarnings("ignore")
    if args.dynamo:
        export_dynamo(args.out_dir)
        return
    for name in MODELS:
        fname = f"{name}_torch2_op{OPSET}.onnx"
        size = ef.export_one(name, OPSET, os.path.join(args.out_dir, fname), **extra)
        print(f"  {fname:24s} {size:9d} bytes")


if __name__ == "__main__":
    main()
