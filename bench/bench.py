#!/usr/bin/env python3
"""Training throughput: PyTorch eager against gpipe-onnx, same models, same batch.

    python3 bench/bench.py --gpipe build/src/gpipe-onnx \\
        [--models resnet50,unet,gpt2] [--precision fp32,tf32] [--warmup 10] [--steps 30] \\
        [--out results.json] [--markdown results.md]

    CPU smoke test (tiny models, gpipe-onnx's CPU backend):
    /usr/bin/python3 bench/bench.py --device cpu --tiny --gpipe build-cpu/src/gpipe-onnx

For every model and precision: PyTorch eager trains the model (models.py) with SGD on
one fixed synthetic batch on cuda:0 (a subprocess per run); gpipe-onnx trains the same
model exported to ONNX (export.py) on synthetic data of the same shapes with the same
optimizer. Both report the median samples/s of the timed steps after the warm-up steps.
See bench/README.md.
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# Shared with pipeline.py.
from common import (LOSS, MODELS, PRECISIONS, device_name, export,  # noqa: E402
                    fmt_rate, gpipe_run, last_line, log, run, summarize)


# --------------------------------------------------------------------------
# PyTorch side: runs in its own process (`bench.py _torch ...`), prints one JSON line
# --------------------------------------------------------------------------
def torch_worker(argv):
    ap = argparse.ArgumentParser(prog="bench.py _torch")
    ap.add_argument("--model", required=True)
    ap.add_argument("--precision", required=True, choices=PRECISIONS)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--warmup", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--momentum", type=float, required=True)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--sdpa", action="store_true")
    a = ap.parse_args(argv)

    import warnings
    warnings.filterwarnings("ignore")
    import torch
    import models as bm

    cuda = a.device.startswith("cuda")
    tf32 = a.precision == "tf32"
    if cuda:
        dev = torch.device("cuda:0")
        torch.cuda.set_device(dev)
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    else:
        dev = torch.device("cpu")
        if tf32:
            raise SystemExit("tf32 needs a GPU")
    model = bm.build(a.model, a.tiny).to(dev).train()
    if a.sdpa and hasattr(model, "use_sdpa"):
        model.use_sdpa(True)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    x, y = bm.make_batch(a.model, a.batch, a.tiny, dev)

    def step():
        out = model(x)
        loss = bm.loss(a.model, out, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    first = None
    for i in range(a.warmup):
        loss = step()
        if i == 0:
            first = float(loss.item())
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    times = []
    t_start = time.perf_counter()
    if cuda:
        # One event per step boundary, no synchronization between steps: the host
        # queues ahead as it would in a training loop; each step's time is the GPU
        # time between its boundaries.
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(a.steps + 1)]
        ev[0].record()
        for i in range(a.steps):
            loss = step()
            ev[i + 1].record()
        sync()
        times = [ev[i].elapsed_time(ev[i + 1]) / 1000.0 for i in range(a.steps)]
    else:
        for i in range(a.steps):
            t0 = time.perf_counter()
            loss = step()
            times.append(time.perf_counter() - t0)
    wall = time.perf_counter() - t_start
    last = float(loss.item())
    if first is None:
        first = last
    res = summarize(a.batch, times) or {}
    res.update({
        "wall_samples_per_s": a.batch * a.steps / wall if wall > 0 else None,
        "first_loss": first, "last_loss": last,
        "parameters": bm.param_count(model),
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(dev) if cuda else platform.processor() or "cpu",
    })
    if cuda:
        res["max_memory_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2 ** 30, 2)
        res["allow_tf32"] = [torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32]
    if last != last or abs(last) == float("inf"):
        res["error"] = "loss became %r" % last
    print("RESULT " + json.dumps(res), flush=True)


# --------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------
def torch_side(args, name, precision, batch):
    cmd = [sys.executable, os.path.abspath(__file__), "_torch", "--model", name,
           "--precision", precision, "--device", args.device, "--batch", str(batch),
           "--warmup", str(args.warmup), "--steps", str(args.steps), "--lr", repr(args.lr),
           "--momentum", repr(args.momentum)]
    cmd += ["--tiny"] if args.tiny else []
    cmd += ["--sdpa"] if args.torch_sdpa else []
    log("%s %s: PyTorch eager, batch %d, %d+%d steps" % (name, precision, batch, args.warmup, args.steps))
    rc, out, err, secs = run(cmd, args.timeout)
    if rc is None:
        return {"error": "PyTorch timed out after %.0f s" % secs}
    res = None
    for line in out.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[len("RESULT "):])
    if rc != 0 or res is None:
        return {"error": "PyTorch failed: " + last_line(err, "exit status %s" % rc)}
    res["run_s"] = round(secs, 1)
    if "error" in res:
        res["error"] = "PyTorch: " + res["error"]
    else:
        log("%s %s: PyTorch %.1f samples/s (median step %.4f s, loss %.4f -> %.4f)" % (
            name, precision, res["samples_per_s"], res["median_step_s"], res["first_loss"],
            res["last_loss"]))
    return res


def gpipe_side(args, name, precision, batch, onnx_path, workdir, variant=None):
    """One gpipe-onnx run; `variant` = (label, extra args) for a --gpipe-variant."""
    tag = "%s-%s%s" % (name, precision, "-" + variant[0] if variant else "")
    metrics = os.path.join(workdir, "%s.metrics.jsonl" % "".join(c if c.isalnum() or c in "-_" else "_" for c in tag))
    total = args.warmup + args.steps
    cmd = [args.gpipe, "train", onnx_path,
           "--synthetic", str(2 * batch), "--batch", str(batch), "--steps", str(total),
           "--devices", args.gpipe_devices,
           "--optimizer", "sgd", "--lr", repr(args.lr), "--momentum", repr(args.momentum),
           "--loss", LOSS[name], "--metrics", metrics]
    if precision == "tf32":
        cmd.append("--tf32")
    if not args.gpipe_verbose:
        cmd.append("--quiet")
    cmd += shlex.split(args.gpipe_args)
    if variant:
        cmd += shlex.split(variant[1])
    what = "gpipe-onnx" + (" [%s]" % variant[0] if variant else "")
    log("%s %s: %s, batch %d, %d+%d steps: %s" % (
        name, precision, what, batch, args.warmup, args.steps, " ".join(shlex.quote(c) for c in cmd)))
    res, err = gpipe_run(cmd, metrics, args.timeout, args.warmup, batch)
    if args.gpipe_verbose and err:
        sys.stdout.write(err)
        sys.stdout.flush()
    if res.get("error"):
        return res
    log("%s %s: %s %.1f samples/s (median step %.4f s, loss %.4f -> %.4f)" % (
        name, precision, what, res["samples_per_s"], res["median_step_s"], res["first_loss"],
        res["last_loss"]))
    return res


def ratio_of(t, g):
    if t and g and not t.get("error") and not g.get("error"):
        return "%.2fx" % (g["samples_per_s"] / t["samples_per_s"])
    return "-"


def table_lines(args, rows):
    """The results table: PyTorch, gpipe-onnx, and a column pair per --gpipe-variant."""
    labels = [v[0] for v in args.variants]
    head = "| model | precision | batch | PyTorch eager samples/s | gpipe-onnx samples/s | ratio |"
    rule = "|---|---|---:|---:|---:|---:|"
    for label in labels:
        head += " gpipe-onnx %s samples/s | ratio |" % label
        rule += "---:|---:|"
    lines = [head, rule]
    for r in rows:
        t, g = r.get("torch"), r.get("gpipe")
        line = "| %s | %s | %d | %s | %s | %s |" % (
            r["model"], r["precision"], r["batch"], fmt_rate(t), fmt_rate(g), ratio_of(t, g))
        for label in labels:
            v = (r.get("variants") or {}).get(label)
            line += " %s | %s |" % (fmt_rate(v), ratio_of(t, v))
        lines.append(line)
    return lines


def write_outputs(args, header, rows):
    doc = dict(header)
    doc["results"] = rows
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(args.out + ".tmp", args.out)
    if args.markdown:
        lines = [
            "## gpipe-onnx vs PyTorch eager: training throughput",
            "",
            "- device: %s" % header["device"],
            "- date: %s" % header["date"],
            "- torch %s; gpipe-onnx --version: %s" % (header["torch"], header["gpipe_version"]),
            "- command: `%s`" % header["command"],
            "- method: SGD (lr %g, momentum %g), synthetic data of the benchmark shapes; "
            "%d warm-up steps, then the median samples/s of %d timed steps (PyTorch: %s per "
            "step; gpipe-onnx: its per-step metrics)" % (
                args.lr, args.momentum, args.warmup, args.steps,
                "CUDA events" if args.device == "cuda" else "perf_counter"),
            "",
        ] + ["- variant %s: gpipe-onnx with `%s`" % v for v in args.variants] + (
            [""] if args.variants else []) + table_lines(args, rows)
        with open(args.markdown + ".tmp", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(args.markdown + ".tmp", args.markdown)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_torch":
        return torch_worker(sys.argv[2:])
    ap = argparse.ArgumentParser(
        description="Training throughput of PyTorch eager and gpipe-onnx on our three benchmark models.")
    ap.add_argument("--models", default=",".join(("resnet50", "unet", "gpt2")),
                    help="comma-separated: resnet50, gpt2, unet (default: all three)")
    ap.add_argument("--precision", default=None,
                    help="comma-separated: fp32, tf32 (default fp32,tf32; fp32 with --device cpu)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps (default 10; 2 with --tiny)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 30; 3 with --tiny)")
    ap.add_argument("--batch", default=None,
                    help="override batch sizes, e.g. resnet50=64,gpt2=8 (default: the targets')")
    ap.add_argument("--lr", type=float, default=0.01, help="SGD learning rate, both sides (0.01)")
    ap.add_argument("--momentum", type=float, default=0.9, help="SGD momentum, both sides (0.9)")
    ap.add_argument("--gpipe", default=None, help="the gpipe-onnx binary (without it: PyTorch only)")
    ap.add_argument("--gpipe-devices", default=None, help="gpipe-onnx --devices (default cuda:0; cpu:0 with --device cpu)")
    ap.add_argument("--gpipe-args", default="", help="extra gpipe-onnx train flags, e.g. '--chunks 4'")
    ap.add_argument("--gpipe-variant", action="append", default=[], metavar="LABEL=ARGS",
                    help="also run gpipe-onnx with these extra flags, in a column of its own, "
                         "e.g. 'fast-conv=--fast-conv' (repeatable)")
    ap.add_argument("--gpipe-verbose", action="store_true", help="no --quiet; echo gpipe-onnx's progress")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch side")
    ap.add_argument("--torch-sdpa", action="store_true",
                    help="PyTorch side of gpt2 uses F.scaled_dot_product_attention (default: plain ops, as exported)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="PyTorch side's device")
    ap.add_argument("--tiny", action="store_true", help="tiny models (CPU smoke test)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per export / run (1800)")
    ap.add_argument("--onnx-dir", default=None, help="keep the exported models here (default: a temp dir)")
    ap.add_argument("--reuse-onnx", action="store_true", help="reuse models already in --onnx-dir")
    ap.add_argument("--out", default=None, help="results as JSON")
    ap.add_argument("--markdown", default=None, help="results as a Markdown table")
    args = ap.parse_args()

    names = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in names:
        if m not in MODELS:
            ap.error("unknown model '%s' (resnet50, gpt2, unet)" % m)
    if args.precision is None:
        args.precision = "fp32" if args.device == "cpu" else "fp32,tf32"
    precisions = [p.strip() for p in args.precision.split(",") if p.strip()]
    for p in precisions:
        if p not in PRECISIONS:
            ap.error("unknown precision '%s' (fp32, tf32)" % p)
    if args.warmup is None:
        args.warmup = 2 if args.tiny else 10
    if args.steps is None:
        args.steps = 3 if args.tiny else 30
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")
    if args.gpipe_devices is None:
        args.gpipe_devices = "cpu:0" if args.device == "cpu" else "cuda:0"
    if args.gpipe:
        args.gpipe = os.path.abspath(args.gpipe)
        if not os.access(args.gpipe, os.X_OK):
            ap.error("--gpipe %s is not an executable" % args.gpipe)
    if args.onnx_dir is None and args.reuse_onnx:
        ap.error("--reuse-onnx needs --onnx-dir")
    args.variants = []
    for item in args.gpipe_variant:
        label, sep, extra = item.partition("=")
        if not sep or not label.strip() or not extra.strip():
            ap.error("--gpipe-variant wants LABEL=ARGS, e.g. 'fast-conv=--fast-conv' (got '%s')" % item)
        args.variants.append((label.strip(), extra.strip()))

    import models as bm
    batches = {m: bm.config(m, args.tiny)["batch"] for m in MODELS}
    if args.batch:
        for item in args.batch.split(","):
            k, _, v = item.partition("=")
            if k not in batches or not v.isdigit() or int(v) < 1:
                ap.error("--batch wants MODEL=N,... (got '%s')" % item)
            batches[k] = int(v)

    gpipe_version = "not run"
    if args.gpipe:
        rc, out, err, _ = run([args.gpipe, "--version"], 60)
        gpipe_version = last_line(out or err, "unknown")
    import torch
    command = " ".join(shlex.quote(c) for c in [sys.executable] + sys.argv)
    header = {
        "device": device_name(args),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "gpipe_version": gpipe_version,
        "command": command,
        "config": {"warmup": args.warmup, "steps": args.steps, "lr": args.lr,
                   "momentum": args.momentum, "tiny": args.tiny, "device": args.device,
                   "gpipe_devices": args.gpipe_devices, "gpipe_args": args.gpipe_args,
                   "gpipe_variants": dict(args.variants),
                   "torch_sdpa": args.torch_sdpa},
    }
    log("device %s, torch %s, gpipe-onnx %s" % (header["device"], header["torch"], gpipe_version))

    tmp = None
    workdir = args.onnx_dir
    if workdir:
        os.makedirs(workdir, exist_ok=True)
    else:
        tmp = workdir = tempfile.mkdtemp(prefix="gpipe-bench-")
    rows = []
    t_all = time.time()
    try:
        for name in names:
            batch = batches[name]
            onnx_path = os.path.join(workdir, "%s%s.onnx" % (name, "-tiny" if args.tiny else ""))
            info, export_error = (None, None)
            if args.gpipe:
                info, export_error = export(args, name, onnx_path)
            for precision in precisions:
                row = {"model": name, "precision": precision, "batch": batch}
                rows.append(row)
                if args.device == "cpu" and precision == "tf32":
                    row["torch"] = row["gpipe"] = {"error": "skipped: tf32 needs a GPU"}
                    write_outputs(args, header, rows)
                    continue
                row["torch"] = None if args.no_torch else torch_side(args, name, precision, batch)
                write_outputs(args, header, rows)
                if not args.gpipe:
                    row["gpipe"] = None
                elif export_error:
                    row["gpipe"] = {"error": export_error}
                else:
                    row["gpipe"] = gpipe_side(args, name, precision, batch, onnx_path, workdir)
                    row["onnx"] = info
                    write_outputs(args, header, rows)
                    row["variants"] = {}
                    for v in args.variants:
                        row["variants"][v[0]] = gpipe_side(args, name, precision, batch, onnx_path,
                                                           workdir, v)
                        write_outputs(args, header, rows)
                write_outputs(args, header, rows)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    write_outputs(args, header, rows)
    log("done in %.0f s" % (time.time() - t_all))
    # The table, also on stdout.
    print("")
    print("\n".join(table_lines(args, rows)), flush=True)


if __name__ == "__main__":
    main()
