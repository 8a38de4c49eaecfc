"""Export a benchmark model (models.py) to ONNX for `gpipe-onnx train`.

    python3 bench/export.py MODEL OUT.onnx [--tiny]

MODEL is resnet50, gpt2 or unet. The recipe is the one of models/export_fixtures.py:
train() mode, TrainingMode.TRAINING (Dropout and BatchNorm export in their training
form), no constant folding, opset 17, the legacy TorchScript exporter (dynamo=False where
torch.onnx.export has that argument, torch >= 2), one input and one output, both with a
dynamic batch axis 0.

What gpipe-onnx then trains (the loss is chosen by `gpipe-onnx train --loss`):

    resnet50  input  float [batch, 3, 224, 224] -> logits [batch, 1000]
              --loss cross-entropy (labels from --synthetic)
    gpt2      idx    int64 [batch, 1024]        -> logits [batch, 1024, 50304]
              --loss cross-entropy (class axis last; labels from --synthetic)
    unet      input  float [batch, 3, 192, 192] -> loss [batch, 1, 192, 192]
              --loss output: the exported model ends in softplus(-logits), the
              per-element BCE-with-logits against ones, and the mean of its output is the
              loss PyTorch computes with F.binary_cross_entropy_with_logits(logits, ones)

The model's metadata records this (bench.model, bench.loss) and the training defaults
`gpipe-onnx train` reads when run without data (gpipe-onnx.batch, .optimizer, .lr; as
models/add_train_defaults.py writes them); flags given on the command line win.
"""
import argparse
import inspect
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models as bm  # noqa: E402

OPSET = 17
EXAMPLE_BATCH = 2

# name -> (input name, output name, gpipe-onnx --loss)
IO = {
    "resnet50": ("input", "logits", "cross-entropy"),
    "gpt2": ("idx", "logits", "cross-entropy"),
    "unet": ("input", "loss", "output"),
}


def exporter_extra():
    extra = {}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        extra["dynamo"] = False          # the legacy TorchScript-based exporter
    return extra


def export_model(name, path, tiny=False, lr=0.01, seed=0):
    """Writes MODEL to path; returns a dict describing it."""
    in_name, out_name, loss_kind = IO[name]
    model = bm.build(name, tiny, seed)
    if name == "unet":
        model = bm.UNetLoss(model)
    model.train()
    shape, dtype = bm.sample_shape(name, tiny)
    x, _ = bm.make_batch(name, EXAMPLE_BATCH, tiny)
    assert tuple(x.shape[1:]) == shape and x.dtype == dtype
    t0 = time.time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (x,),
            path,
            export_params=True,
            opset_version=OPSET,
            training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=False,
            input_names=[in_name],
            output_names=[out_name],
            dynamic_axes={in_name: {0: "batch"}, out_name: {0: "batch"}},
            **exporter_extra(),
        )
    seconds = time.time() - t0
    batch = bm.config(name, tiny)["batch"]
    info = {
        "model": name, "tiny": tiny, "path": path, "input": in_name, "output": out_name,
        "loss": loss_kind, "parameters": bm.param_count(model), "opset": OPSET,
        "torch": torch.__version__, "export_s": round(seconds, 2),
    }
    try:
        import onnx
    except ImportError:
        return info
    m = onnx.load(path, load_external_data=False)
    meta = {
        "bench.model": name + (" (tiny)" if tiny else ""),
        "bench.loss": loss_kind,
        "gpipe-onnx.batch": str(batch),
        "gpipe-onnx.optimizer": "sgd",
        "gpipe-onnx.lr": repr(lr),
    }
    kept = [p for p in m.metadata_props if p.key not in meta]
    del m.metadata_props[:]
    m.metadata_props.extend(kept)
    for k, v in meta.items():
        m.metadata_props.add(key=k, value=v)
    onnx.save(m, path)
    ops = {}
    for n in m.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    info["ops"] = dict(sorted(ops.items()))
    info["bytes"] = os.path.getsize(path)
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=bm.MODEL_NAMES)
    ap.add_argument("out", help="the .onnx file to write")
    ap.add_argument("--tiny", action="store_true", help="the tiny (smoke-test) size")
    ap.add_argument("--lr", type=float, default=0.01, help="lr written to the metadata")
    ap.add_argument("--json", action="store_true", help="print the description as JSON")
    args = ap.parse_args()
    info = export_model(args.model, args.out, args.tiny, args.lr)
    if args.json:
        import json
        print(json.dumps(info))
    else:
        print("%s: %s, %d parameters, %.1f MB, %s s, ops %s" % (
            args.model, args.out, info["parameters"], info.get("bytes", 0) / 1e6,
            info["export_s"], info.get("ops")))


if __name__ == "__main__":
    main()
