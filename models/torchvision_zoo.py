"""The torchvision classification families, exported small and trained 3 steps against PyTorch.

Run with the interpreter that has torch, torchvision, onnx and numpy (Debian's python3-torch
1.13 here; see regenerate.sh), with a built gpipe-onnx:

    python3 models/torchvision_zoo.py --gpipe build-cpu/src/gpipe-onnx [--only resnet18 ...]
        [--work DIR] [--json zoo.json] [--markdown zoo.md]

For each family (and the segmentation models PyTorch exports in training mode: fcn,
deeplabv3, lraspp, a class per pixel): the torchvision model with 10 classes, in train() mode,
every Dropout and stochastic depth at p = 0, exported as README's recipe says (opset 17,
training mode, no constant folding, a dynamic batch axis); batch 4 of random images of the
family's size (64 px; 224 for alexnet, vgg and maxvit, whose pooling or partitions export only
at their native size; 96 for inception) and random labels. Then three SGD steps
(lr 0.01, momentum 0.9, cross-entropy) in PyTorch in float64 and in float32, from the weights
that were exported, and in gpipe-onnx (CPU, fp32, `train --steps 3 --metrics`). A family
matches when each of gpipe-onnx's three losses is as close to PyTorch's float64 loss as
PyTorch's own float32 run is, with a floor of 1e-5 relative (small BatchNorm nets are chaotic:
comparing float32 runs with each other would measure the chaos, not the implementation).
Each family's outcome is one of: export failed (PyTorch's exporter), load failed (gpipe-onnx
names what it does not support), train failed, differs, matches.

Python is only the harness: the numbers are gpipe-onnx's and PyTorch's.
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

BATCH = 4
STEPS = 3
LR = 0.01
MOMENTUM = 0.9
CLASSES = 10
FLOOR = 1e-5


class SegmentationOut(nn.Module):
    """torchvision's segmentation models return {"out": logits, ...}: the logits alone."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)["out"]


def families():
    """name -> (constructor, image size, dense): dense models predict a class per pixel."""
    m = torchvision.models
    seg = torchvision.models.segmentation
    return {
        "alexnet": (lambda: m.alexnet(num_classes=CLASSES), 224, False),
        "vgg11_bn": (lambda: m.vgg11_bn(num_classes=CLASSES), 224, False),
        "resnet18": (lambda: m.resnet18(num_classes=CLASSES), 64, False),
        "resnet50": (lambda: m.resnet50(num_classes=CLASSES), 64, False),
        "resnext50_32x4d": (lambda: m.resnext50_32x4d(num_classes=CLASSES), 64, False),
        "wide_resnet50_2": (lambda: m.wide_resnet50_2(num_classes=CLASSES), 64, False),
        "squeezenet1_1": (lambda: m.squeezenet1_1(num_classes=CLASSES), 64, False),
        "densenet121": (lambda: m.densenet121(num_classes=CLASSES), 64, False),
        "googlenet": (lambda: m.googlenet(num_classes=CLASSES, aux_logits=False, init_weights=True), 64, False),
        "inception_v3": (lambda: m.inception_v3(num_classes=CLASSES, aux_logits=False, init_weights=True), 96, False),
        "shufflenet_v2_x0_5": (lambda: m.shufflenet_v2_x0_5(num_classes=CLASSES), 64, False),
        "mobilenet_v2": (lambda: m.mobilenet_v2(num_classes=CLASSES), 64, False),
        "mobilenet_v3_small": (lambda: m.mobilenet_v3_small(num_classes=CLASSES), 64, False),
        "mnasnet0_5": (lambda: m.mnasnet0_5(num_classes=CLASSES), 64, False),
        "efficientnet_b0": (lambda: m.efficientnet_b0(num_classes=CLASSES), 64, False),
        "regnet_y_400mf": (lambda: m.regnet_y_400mf(num_classes=CLASSES), 64, False),
        "convnext_tiny": (lambda: m.convnext_tiny(num_classes=CLASSES), 64, False),
        "vit_b_16": (lambda: m.vit_b_16(num_classes=CLASSES, image_size=64), 64, False),
        "swin_t": (lambda: m.swin_t(num_classes=CLASSES), 64, False),
        "maxvit_t": (lambda: m.maxvit_t(num_classes=CLASSES), 224, False),
        "fcn_resnet50": (lambda: SegmentationOut(seg.fcn_resnet50(num_classes=CLASSES, weights_backbone=None)), 64, True),
        "deeplabv3_mobilenet_v3_large": (lambda: SegmentationOut(seg.deeplabv3_mobilenet_v3_large(
            num_classes=CLASSES, weights_backbone=None)), 64, True),
        "lraspp_mobilenet_v3_large": (lambda: SegmentationOut(seg.lraspp_mobilenet_v3_large(
            num_classes=CLASSES, weights_backbone=None)), 64, True),
    }


def no_dropout(model):
    for mod in model.modules():
        if isinstance(mod, nn.Dropout):
            mod.p = 0.0
        # torchvision's stochastic depth (efficientnet, convnext, swin, maxvit)
        if type(mod).__name__ == "StochasticDepth":
            mod.p = 0.0
    return model


def torch_losses(model, x, y, dtype, lr):
    """Three SGD steps from the model's current weights; the loss before each."""
    model = copy.deepcopy(model).to(dtype).train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
    losses = []
    for _ in range(STEPS):
        out = model(x.to(dtype))
        if isinstance(out, tuple):
            out = out[0]
        loss = F.cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def run_family(name, make, size, dense, gpipe, work, timeout, lr):
    r = {"family": name, "image": size, "batch": BATCH}
    torch.manual_seed(0)
    model = no_dropout(make()).train()
    gen = np.random.RandomState(0)
    x = gen.standard_normal((BATCH, 3, size, size)).astype(np.float32)
    y = gen.randint(0, CLASSES, size=(BATCH, size, size) if dense else BATCH).astype(np.int64)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    onnx_path = os.path.join(work, name + ".onnx")
    t0 = time.time()
    try:
        # The exporter runs the model once; in train() mode that updates the BatchNorm running
        # statistics, which training does not read: the weights stay those of the copy below.
        start = copy.deepcopy(model)
        torch.onnx.export(model, xt, onnx_path, opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
        model = start
    except Exception as e:  # the exporter's refusal, whatever its type
        r["outcome"] = "export failed"
        r["why"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        return r
    r["export_s"] = round(time.time() - t0, 1)
    np.save(os.path.join(work, name + "_x.npy"), x)
    np.save(os.path.join(work, name + "_y.npy"), y)
    metrics = os.path.join(work, name + "_metrics.jsonl")
    cmd = [gpipe, "train", onnx_path, "--data", os.path.join(work, name + "_x.npy"), "--labels",
           os.path.join(work, name + "_y.npy"), "--batch", str(BATCH), "--steps", str(STEPS), "--optimizer",
           "sgd", "--lr", str(lr), "--momentum", str(MOMENTUM), "--loss", "cross-entropy", "--dropout", "0",
           "--devices", "cpu:0", "--metrics", metrics]
    r["command"] = " ".join(cmd)
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        r["outcome"] = "train failed"
        r["why"] = f"timed out after {timeout} s"
        return r
    r["train_s"] = round(time.time() - t0, 1)
    if p.returncode != 0:
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        why = lines[-1] if lines else f"exit status {p.returncode}"
        r["outcome"] = "load failed" if "unsupported op" in why or "no kernel" in why else "train failed"
        r["why"] = why[:400]
        return r
    ours = [json.loads(l)["loss"] for l in open(metrics) if l.strip()]
    f64 = torch_losses(model, xt, yt, torch.float64, lr)
    f32 = torch_losses(model, xt, yt, torch.float32, lr)
    r["losses"] = {"gpipe_onnx": ours, "torch_float64": f64, "torch_float32": f32}
    allow = [max(rel(a, b), FLOOR) for a, b in zip(f32, f64)]
    dist = [rel(a, b) for a, b in zip(ours, f64)]
    r["distance"] = dist
    r["allowance"] = allow
    ok = len(ours) == STEPS and all(d <= a for d, a in zip(dist, allow))
    r["outcome"] = "matches" if ok else "differs"
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpipe", required=True, help="the gpipe-onnx binary")
    ap.add_argument("--only", nargs="*", help="these families only")
    ap.add_argument("--work", help="folder for the exports and data (default: a temporary one)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per gpipe-onnx run")
    ap.add_argument("--lr", type=float, default=LR, help=f"SGD learning rate (default {LR})")
    ap.add_argument("--json", help="results as JSON")
    ap.add_argument("--markdown", help="the table as Markdown")
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    fams = families()
    names = args.only or list(fams)
    unknown = [n for n in names if n not in fams]
    if unknown:
        sys.exit(f"torchvision_zoo.py: unknown families {unknown}; known: {sorted(fams)}")
    work = args.work or tempfile.mkdtemp(prefix="gp-zoo-")
    os.makedirs(work, exist_ok=True)
    rows = []
    for n in names:
        make, size, dense = fams[n]
        print(f"[zoo] {n} ({size} px) ...", flush=True)
        r = run_family(n, make, size, dense, args.gpipe, work, args.timeout, args.lr)
        rows.append(r)
        detail = r.get("why", "")
        if "distance" in r:
            detail = "distance to float64 " + ", ".join(f"{d:.1e}" for d in r["distance"]) + \
                     "; float32's " + ", ".join(f"{a:.1e}" for a in r["allowance"])
        print(f"[zoo] {n}: {r['outcome']}: {detail}", flush=True)
    lines = ["| family | image | outcome | detail |", "|---|---:|---|---|"]
    for r in rows:
        detail = r.get("why", "")
        if "distance" in r:
            detail = "losses " + ", ".join(f"{v:.6f}" for v in r["losses"]["gpipe_onnx"]) + \
                     "; distance to PyTorch float64 " + ", ".join(f"{d:.1e}" for d in r["distance"]) + \
                     " (float32's " + ", ".join(f"{a:.1e}" for a in r["allowance"]) + ")"
        lines.append(f"| {r['family']} | {r['image']} | {r['outcome']} | {detail.replace('|', '/')} |")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "torchvision": torchvision.__version__, "batch": BATCH,
                       "steps": STEPS, "lr": args.lr, "momentum": MOMENTUM, "rows": rows}, f, indent=1)
    bad = [r for r in rows if r["outcome"] != "matches"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
