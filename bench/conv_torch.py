#!/usr/bin/env python3
"""Each convolution gpipe-onnx chose algorithms for, timed in PyTorch on the same GPU:

    GP_CONV_VERBOSE=1 gpipe-onnx balance MODEL.onnx --devices cuda:0 --precision bf16 ... 2> choices.log
    python3 bench/conv_torch.py choices.log [--onnx MODEL.onnx --batch B] [--out conv.json] [--markdown conv.md]

gpipe-onnx's `conv-choice` lines (src/backend/cuda/conv_algos.cu) give each problem (shapes,
stride, padding, groups, storage) and, per direction (forward, data gradient, filter
gradient), what cuDNN measured for the algorithm gpipe-onnx runs. This script runs the same
problems through PyTorch (`F.conv2d`/`conv_transpose2d` and `aten.convolution_backward` for
one gradient at a time), with `cudnn.benchmark` on, in NCHW and in channels_last, and with
cuDNN's deterministic algorithms only unless `--nondeterministic`: per direction its median
time over `--reps` runs (CUDA events) and the kernels it launched (torch.profiler). With
`--onnx`, each problem is counted as often as the model's Conv nodes have it, so the sums are
per training step of one micro-batch of `--batch` samples.

Python is only the harness here: the numbers are PyTorch's kernels on cuDNN, beside the times
cuDNN reported to gpipe-onnx for its own choices.
"""
import argparse
import json
import re
import sys

PROBLEM = re.compile(r"conv-choice problem (.*)$")
CHOSEN = re.compile(r"conv-choice chosen (fwd|data|filter) (legacy|graph) (\S+) ms=(-?[0-9.]+)")


def dims(text):
    return [int(v) for v in text.split("x")]


def parse_log(path):
    """The problems in order, each with gpipe-onnx's chosen algorithm and time per direction."""
    problems, current = [], None
    for line in open(path, errors="replace"):
        m = PROBLEM.search(line)
        if m:
            f = dict(kv.split("=", 1) for kv in m.group(1).split())
            current = {
                "n": int(f["n"]), "img_ch": int(f["img_ch"]), "img": dims(f["img"]),
                "col_ch": int(f["col_ch"]), "col": dims(f["col"]), "k": dims(f["k"]),
                "s": dims(f["s"]), "q": dims(f["q"]), "d": dims(f["d"]), "group": int(f["group"]),
                "transpose": f["transpose"] == "1", "direct": f["direct"] == "1",
                "mode": f["mode"], "fast": f["fast"] == "1", "ours": {},
            }
            problems.append(current)
            continue
        m = CHOSEN.search(line)
        if m and current is not None:
            current["ours"][m.group(1)] = {"api": m.group(2), "algo": m.group(3), "ms": float(m.group(4))}
    return problems


def key_of(p):
    return (p["transpose"], p["img_ch"], tuple(p["img"]), p["col_ch"], tuple(p["col"]), tuple(p["k"]),
            tuple(p["s"]), tuple(p["q"]), tuple(p["d"]), p["group"])


def onnx_counts(path, batch):
    """How many Conv nodes of the model have each (non-transposed, symmetric-pad) problem."""
    import onnx
    from onnx import shape_inference
    model = onnx.load(path, load_external_data=False)
    model = shape_inference.infer_shapes(model)
    shapes = {}
    for vi in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        t = vi.type.tensor_type
        if t.HasField("shape"):
            shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
    inits = {i.name: list(i.dims) for i in model.graph.initializer}
    counts = {}
    for node in model.graph.node:
        if node.op_type != "Conv":
            continue
        x, w = shapes.get(node.input[0]), inits.get(node.input[1])
        y = shapes.get(node.output[0])
        if not x or not w or not y or None in x[1:] or None in y[1:]:
            continue
        a = {at.name: onnx.helper.get_attribute_value(at) for at in node.attribute}
        ns = len(x) - 2
        pads = list(a.get("pads", [0] * (2 * ns)))
        if pads[:ns] != pads[ns:]:
            continue
        key = (False, x[1], tuple(x[2:]), w[0], tuple(y[2:]), tuple(w[2:]),
               tuple(a.get("strides", [1] * ns)), tuple(pads[:ns]), tuple(a.get("dilations", [1] * ns)),
               int(a.get("group", 1)))
        counts[key] = counts.get(key, 0) + 1
    return counts


def time_problem(torch, p, channels_last, reps, kernels):
    F = torch.nn.functional
    dt = torch.bfloat16 if p["mode"] == "bf16" else torch.float32
    dev = "cuda"
    n, g = p["n"], p["group"]
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    if p["transpose"]:
        x = torch.randn([n, p["col_ch"]] + p["col"], device=dev, dtype=dt)
        w = torch.randn([p["col_ch"], p["img_ch"] // g] + p["k"], device=dev, dtype=dt)
        outp = [p["img"][i] - ((p["col"][i] - 1) * p["s"][i] - 2 * p["q"][i] + (p["k"][i] - 1) * p["d"][i] + 1)
                for i in range(len(p["k"]))]
        y_shape = [n, p["img_ch"]] + p["img"]
    else:
        x = torch.randn([n, p["img_ch"]] + p["img"], device=dev, dtype=dt)
        w = torch.randn([p["col_ch"], p["img_ch"] // g] + p["k"], device=dev, dtype=dt)
        outp = [0] * len(p["k"])
        y_shape = [n, p["col_ch"]] + p["col"]
    x = x.contiguous(memory_format=fmt)
    w = w.contiguous(memory_format=fmt)
    dy = torch.randn(y_shape, device=dev, dtype=dt).contiguous(memory_format=fmt)
    conv = torch.ops.aten.convolution_backward

    def fwd():
        if p["transpose"]:
            return F.conv_transpose2d(x, w, None, p["s"], p["q"], outp, g, p["d"])
        return F.conv2d(x, w, None, p["s"], p["q"], p["d"], g)

    def grad(mask):
        return lambda: conv(dy, x, w, None, p["s"], p["q"], p["d"], p["transpose"], outp, g, mask)

    ops = {"fwd": fwd, "data": grad([True, False, False]), "filter": grad([False, True, False])}
    out = {}
    for name, fn in ops.items():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        times.sort()
        entry = {"ms": times[len(times) // 2]}
        if kernels:
            from torch.profiler import profile, ProfilerActivity
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            entry["kernels"] = sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})
        out[name] = entry
    return out


def describe(p):
    k = "x".join(map(str, p["k"]))
    s = "x".join(map(str, p["s"]))
    sp = "x".join(map(str, p["img"]))
    op = "ConvTranspose" if p["transpose"] else "Conv"
    g = f" g{p['group']}" if p["group"] != 1 else ""
    return f"{op} {p['img_ch']}@{sp} -> {p['col_ch']} k{k} s{s}{g}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", help="stderr of a gpipe-onnx run with GP_CONV_VERBOSE=1")
    ap.add_argument("--onnx", help="the model, to count each problem as often as its Conv nodes have it")
    ap.add_argument("--batch", type=int, default=0, help="the micro-batch of the log (for --onnx)")
    ap.add_argument("--mode", default="", help="only problems of this storage mode (bf16, tf32, fp32)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--nondeterministic", action="store_true", help="let cuDNN use nondeterministic algorithms")
    ap.add_argument("--kernels", action="store_true", help="record PyTorch's kernel names (torch.profiler)")
    ap.add_argument("--out", help="JSON results")
    ap.add_argument("--markdown", help="the table as Markdown")
    args = ap.parse_args()

    import torch
    if not torch.cuda.is_available():
        sys.exit("conv_torch.py: needs a CUDA GPU")
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.deterministic = not args.nondeterministic
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    problems = [p for p in parse_log(args.log) if not args.mode or p["mode"] == args.mode]
    seen, unique = set(), []
    for p in problems:
        k = key_of(p) + (p["mode"],)
        if k not in seen and len(p["k"]) == 2:
            seen.add(k)
            unique.append(p)
    counts = onnx_counts(args.onnx, args.batch) if args.onnx else {}
    rows = []
    for p in unique:
        count = counts.get(key_of(p), 0 if counts else 1)
        res = {"nchw": time_problem(torch, p, False, args.reps, args.kernels),
               "nhwc": time_problem(torch, p, True, args.reps, args.kernels)}
        rows.append({"problem": p, "count": count, "torch": res})
        ours = " ".join(f"{d}={p['ours'].get(d, {}).get('ms', -1):.3f}" for d in ("fwd", "data", "filter"))
        th = " ".join(f"{d}={res['nchw'][d]['ms']:.3f}/{res['nhwc'][d]['ms']:.3f}" for d in ("fwd", "data", "filter"))
        print(f"[conv_torch] {describe(p)} {p['mode']} x{count}: ours {ours}; torch nchw/nhwc {th}", flush=True)

    lines = ["| problem | mode | count | ours fwd | data | filter | PyTorch NCHW fwd | data | filter | "
             "channels_last fwd | data | filter |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    total = {"ours": [0.0] * 3, "nchw": [0.0] * 3, "nhwc": [0.0] * 3}
    for r in rows:
        p, c = r["problem"], r["count"]
        ours = [p["ours"].get(d, {}).get("ms", float("nan")) for d in ("fwd", "data", "filter")]
        nchw = [r["torch"]["nchw"][d]["ms"] for d in ("fwd", "data", "filter")]
        nhwc = [r["torch"]["nhwc"][d]["ms"] for d in ("fwd", "data", "filter")]
        for i in range(3):
            total["ours"][i] += c * (ours[i] if ours[i] >= 0 else 0)
            total["nchw"][i] += c * nchw[i]
            total["nhwc"][i] += c * nhwc[i]
        cells = [f"{v:.3f}" for v in ours + nchw + nhwc]
        lines.append(f"| {describe(p)} | {p['mode']} | {c} | " + " | ".join(cells) + " |")
    cells = [f"**{v:.2f}**" for v in total["ours"] + total["nchw"] + total["nhwc"]]
    lines.append("| **sum x count** | | | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                       "device": torch.cuda.get_device_name(), "deterministic": not args.nondeterministic,
                       "rows": rows, "totals_ms": total}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
