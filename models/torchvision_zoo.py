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
that were exported, and in gpipe-onnx (CPU, fp32, `train --steps 3 --metrics`). These small
BatchNorm nets at batch 4 are chaotic after the first step (PyTorch's own float32 run leaves
its float64 run by percents by the third), so the verdict rests on the first step: the first
loss as close to float64's as PyTorch's float32 is (at least 1e-5 relative), and the first
step's gradient (gpipe-onnx: w0 - w1 after one SGD step at lr 1 without momentum, `--save`)
within max(4x PyTorch float32's distance, 1e-5, the float32 rounding of w1) of float64's,
||g - g64|| / ||g64|| over all parameters. The later losses are reported beside.
Each family's outcome is one of: export failed (PyTorch's exporter), load failed (gpipe-onnx
names what it does not support), train failed, differs, matches.

A ReLU kink: a value before a ReLU within float32's rounding of zero takes one side in
float64 and may take the other in any float32 run, and at batch 4 on small maps one element's
gradient moves the whole first step (mnasnet0_5: one value at -1.25e-6 in float64, +1.76e-6 in
gpipe-onnx, -1.69e-6 in PyTorch float32, against a float32 error of 8e-6 rms at that layer,
where gpipe-onnx's own error is no larger than PyTorch's). A gradient that differs is therefore
checked against float64's with the ReLU's side flipped at the values nearest zero (relative to
that ReLU's float32 error): if flipping some of them, one at a time, brings the distance within
the allowance, the family matches "with N kinks", and the kinks are reported (mnasnet0_5 at
128 px needs two, 6.0e-7 and 1.2e-5 from zero; both are the ones found by bisecting gpipe-onnx's own
ReLU signs at their layers).

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
KINK_SIGMAS = 4    # a ReLU input within this many of its float32 error rms of zero is a kink candidate
KINK_CANDIDATES = 24
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


class relu_patch:
    """Within the block, every F.relu call (nn.ReLU's too) is numbered in call order, which is
    the same in float32 and float64: record=True keeps each call's input as float64; flips =
    {call: flat indices} computes those elements' ReLU as if their input had the other sign
    (the value is kept, the gradient passes or not)."""

    def __init__(self, record=False, flips=None):
        self.record, self.flips, self.inputs, self.calls = record, flips or {}, [], 0

    def __enter__(self):
        self.orig = F.relu

        def relu(input, inplace=False):
            k = self.calls
            self.calls += 1
            if self.record:
                self.inputs.append(input.detach().to(torch.float64).numpy().copy())
            if k not in self.flips:
                return self.orig(input, inplace=inplace)
            keep = (input > 0).flatten()
            idx = torch.tensor(self.flips[k], dtype=torch.long)
            keep[idx] = ~keep[idx]
            return input * keep.view(input.shape).to(input.dtype)

        F.relu = relu
        return self

    def __exit__(self, *exc):
        F.relu = self.orig


def torch_grads(model, x, y, dtype, flips=None):
    """The gradient of the first step's loss, per parameter name (flips: relu_patch's)."""
    model = copy.deepcopy(model).to(dtype).train()
    with relu_patch(flips=flips):
        out = model(x.to(dtype))
        if isinstance(out, tuple):
            out = out[0]
        F.cross_entropy(out, y).backward()
    return {n: p.grad.detach().to(torch.float64).numpy() for n, p in model.named_parameters() if p.grad is not None}


def kink_candidates(model, x):
    """ReLU inputs nearest zero relative to their call's float32 error (PyTorch float32 against
    float64, rms over the call's elements), where float32 and float64 agree on the side:
    [(ratio, call, flat index, float64 value, rms)], nearest first."""
    ins = {}
    for dt in (torch.float64, torch.float32):
        m = copy.deepcopy(model).to(dt).train()
        with torch.no_grad(), relu_patch(record=True) as rp:
            m(x.to(dt))
        ins[dt] = rp.inputs
    found = []
    for k, (a, b) in enumerate(zip(ins[torch.float64], ins[torch.float32])):
        if a.shape != b.shape:
            return []  # the calls did not line up: no explanation offered
        a, b = a.ravel(), b.ravel()
        rms = float(np.sqrt(np.mean((b - a) ** 2)))
        if rms == 0:
            continue
        near = np.nonzero((np.abs(a) < KINK_SIGMAS * rms) & ((a > 0) == (b > 0)) & (a != 0))[0]
        found += [(abs(a[i]) / rms, k, int(i), float(a[i]), rms) for i in near]
    return sorted(found)[:KINK_CANDIDATES]


def explain_by_kinks(model, xt, yt, ours, g64, allowance):
    """Flips the kink candidates one at a time, nearest first, keeping each flip that brings
    gpipe-onnx's gradient at least a tenth nearer float64's (two kinks each explain only part
    of the distance: mnasnet0_5 at 128 px): (distance after, the kinks kept)."""
    flips, kept = {}, []
    best, _ = grad_distance(ours, g64)
    for ratio, call, i, v, rms in kink_candidates(model, xt):
        if best <= allowance:
            break
        trial = {c: list(ix) for c, ix in flips.items()}
        trial.setdefault(call, []).append(i)
        d, _ = grad_distance(ours, torch_grads(model, xt, yt, torch.float64, trial))
        if d < 0.9 * best:
            flips, best = trial, d
            kept.append({"relu_call": call, "element": i, "float64_value": v, "float32_error_rms": rms})
    return best, kept


def gpipe_grads(gpipe, onnx_path, x_path, y_path, work, name, timeout):
    """gpipe-onnx's gradient of the first step: one SGD step at lr 1 without momentum,
    w0 - w1, per initializer name (exact to the rounding of w1)."""
    import onnx
    from onnx import numpy_helper
    saved = os.path.join(work, name + "_step1.onnx")
    cmd = [gpipe, "train", onnx_path, "--data", x_path, "--labels", y_path, "--batch", str(BATCH), "--steps", "1",
           "--optimizer", "sgd", "--lr", "1", "--momentum", "0", "--loss", "cross-entropy", "--dropout", "0",
           "--devices", "cpu:0", "--save", saved]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        raise RuntimeError(lines[-1] if lines else f"exit status {p.returncode}")
    w0 = {i.name: numpy_helper.to_array(i) for i in onnx.load(onnx_path).graph.initializer}
    w1 = {i.name: numpy_helper.to_array(i) for i in onnx.load(saved).graph.initializer}
    return {n: (w0[n].astype(np.float64) - w1[n].astype(np.float64), w0[n]) for n in w0 if n in w1}


def grad_distance(ours, ref):
    """||ours - ref|| / ||ref|| over the parameters both have, and the name of the worst one."""
    num = den = 0.0
    worst, worst_d = None, -1.0
    for n, g in ref.items():
        if n not in ours:
            continue
        o = ours[n][0] if isinstance(ours[n], tuple) else ours[n]
        d2 = float(np.sum((o - g) ** 2))
        r2 = float(np.sum(g ** 2))
        num += d2
        den += r2
        d = (d2 / r2) ** 0.5 if r2 > 0 else (0.0 if d2 == 0 else float("inf"))
        if d > worst_d:
            worst, worst_d = n, d
    return (num / den) ** 0.5 if den > 0 else 0.0, worst


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
    # The first step's gradient: well conditioned where the loss curves of these small
    # BatchNorm nets are chaotic after it.
    try:
        g_ours = gpipe_grads(gpipe, onnx_path, os.path.join(work, name + "_x.npy"), os.path.join(work, name + "_y.npy"),
                             work, name, timeout)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        r["outcome"] = "train failed"
        r["why"] = f"the one-step run: {e}"[:400]
        return r
    g64 = torch_grads(model, xt, yt, torch.float64)
    g32 = torch_grads(model, xt, yt, torch.float32)
    missing = [n for n in g64 if n not in g_ours]
    d_ours, worst = grad_distance(g_ours, g64)
    d_32, _ = grad_distance(g32, g64)
    # w1 = w0 - g is rounded to float32: that much of w0 - w1 is rounding, not gradient.
    floor2 = sum(float(np.sum(((np.abs(w0) + np.abs(g64[n])) * 2.0 ** -23) ** 2))
                 for n, (_, w0) in g_ours.items() if n in g64)
    den2 = sum(float(np.sum(g ** 2)) for g in g64.values())
    g_allow = max(4 * d_32, (floor2 / den2) ** 0.5 if den2 > 0 else 0.0, FLOOR)
    r["gradient"] = {"distance": d_ours, "worst_tensor": worst, "torch_float32_distance": d_32,
                     "allowance": g_allow, "parameters": len(g64), "missing": missing[:10]}
    if not missing and d_ours > g_allow and dist[0] <= allow[0]:
        d_kinks, kinks = explain_by_kinks(model, xt, yt, g_ours, g64, g_allow)
        if kinks and d_kinks <= g_allow:
            r["gradient"]["kinks"] = kinks
            r["gradient"]["distance_with_kinks"] = d_kinks
    ok = not missing and dist[0] <= allow[0] and (d_ours <= g_allow or "kinks" in r["gradient"])
    r["outcome"] = "matches" if ok else "differs"
    return r


def kink_note(gr):
    """' (with N ReLU kinks: ...)' when the match needed them, else ''."""
    if "kinks" not in gr:
        return ""
    ks = "; ".join(f"ReLU call {k['relu_call']} element {k['element']}: {k['float64_value']:.2e} in float64, "
                   f"float32 error rms {k['float32_error_rms']:.1e}" for k in gr["kinks"])
    return f" (with {len(gr['kinks'])} ReLU kink{'s' if len(gr['kinks']) > 1 else ''} flipped: {ks}; " \
           f"then {gr['distance_with_kinks']:.1e})"


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
        if "gradient" in r:
            gr = r["gradient"]
            detail = f"first-step gradient {gr['distance']:.1e} from float64 (float32's {gr['torch_float32_distance']:.1e}," \
                     f" allowed {gr['allowance']:.1e}){kink_note(gr)}; losses " + ", ".join(f"{d:.1e}" for d in r["distance"]) + \
                     " from float64 (float32's " + ", ".join(f"{a:.1e}" for a in r["allowance"]) + ")"
        print(f"[zoo] {n}: {r['outcome']}: {detail}", flush=True)
    lines = ["| family | image | outcome | first-step gradient from PyTorch float64 (PyTorch float32's); "
             "gpipe-onnx's 3 losses, their distance from float64's (float32's) |", "|---|---:|---|---|"]
    for r in rows:
        detail = r.get("why", "")
        if "gradient" in r:
            gr = r["gradient"]
            detail = f"gradient {gr['distance']:.1e} (float32 {gr['torch_float32_distance']:.1e}){kink_note(gr)}; losses " + \
                     ", ".join(f"{v:.4f}" for v in r["losses"]["gpipe_onnx"]) + ", from float64 " + \
                     ", ".join(f"{d:.0e}" for d in r["distance"]) + " (float32 " + \
                     ", ".join(f"{a:.0e}" for a in r["allowance"]) + ")"
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
