"""The side-by-side profile that `python3 bench/profile.py MODEL PRECISION ...` runs (main()
here; profile.py is only its entry point): where one training step's time goes, in PyTorch
and in gpipe-onnx, for the same model, batch and precision, per op class (convolution
forward, data and weight gradient, matrix products, normalization, elementwise, copies,
optimizer, idle gaps, ...).

PyTorch (its own process, `profile.py _torch`): bench.py's training step of that variant, W
warm-up steps, N steps timed with CUDA events, then N steps under torch.profiler (CPU and
CUDA activities); every GPU kernel is classified by its name and the ops that launched it
(op_classes.py), idle is the part of the steps' span on the GPU with no kernel running.
gpipe-onnx: its per-layer profile (`gpipe-onnx balance --profile-out`: each layer's forward
and backward timed alone on the device) classified by ONNX op type, and `gpipe-onnx train
--metrics` for the real step time; what the step spends outside the profiled layers (loss,
optimizer, input copy, gaps) is one remainder. See bench/README.md ("Profile").
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
PROFILE_PY = os.path.join(HERE, "profile.py")      # the entry point; `profile.py _torch` is the worker
sys.path.insert(0, HERE)

import bench  # noqa: E402
import op_classes as oc  # noqa: E402
from common import (MODELS, device_name, error_line, export, gpipe_version, log,  # noqa: E402
                    md_cell, quote, run, set_log_prefix, worker_result)

STEP_MARKER = "bench.profile step "   # the record_function around each profiled step


# --------------------------------------------------------------------------
# PyTorch side: runs in its own process (`profile.py _torch ...`), prints one JSON line
# --------------------------------------------------------------------------
def torch_worker(argv):
    ap = argparse.ArgumentParser(prog="profile.py _torch")
    ap.add_argument("--model", required=True, choices=MODELS)
    ap.add_argument("--precision", required=True, choices=bench.PRECISIONS)
    ap.add_argument("--variant", default="best", choices=bench.TORCH_VARIANTS)
    ap.add_argument("--compile-mode", default="default", choices=bench.COMPILE_MODES)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--warmup", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--momentum", type=float, required=True)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--trace-out", default=None, help="keep the profiler's Chrome trace here")
    a = ap.parse_args(argv)
    a.sdpa = False                      # bench.torch_setup's --torch-sdpa: the variant decides

    import warnings
    warnings.filterwarnings("ignore")
    try:
        res = torch_profile(a)
    except Exception as e:               # reported in the output, the driver goes on
        if not isinstance(e, bench.Unavailable):
            import traceback
            traceback.print_exc()
        res = {"error": bench.short_error(e)}
    print("RESULT " + json.dumps(res), flush=True)


def torch_profile(a):
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    t = bench.torch_setup(a)
    activities = [ProfilerActivity.CPU]
    if t.cuda:
        supported = torch.profiler.supported_activities()
        if ProfilerActivity.CUDA not in supported:
            raise bench.Unavailable("torch.profiler cannot record CUDA kernels in this torch build "
                                    "(torch %s: no kineto/CUPTI)" % torch.__version__)
        activities.append(ProfilerActivity.CUDA)
    first, warm_times = bench.torch_warmup(t, a.warmup)
    # The step without the profiler, timed as bench.py times it: what the profiled span
    # per step is to be held against (the profiler's own cost shows as idle gaps).
    graphs_before = t.compiled_graphs()
    times, _, _ = bench.torch_time(t, a.steps)
    # A first one-step profile, thrown away: the profiler's start-up (CUPTI's first
    # activation) happens there, not in the profiled steps.
    with profile(activities=activities):
        t.step()
        t.sync()
    with profile(activities=activities) as prof:
        for i in range(a.steps):
            with record_function(STEP_MARKER + str(i)):
                loss = t.step()
        t.sync()                          # kernels still running would be missing
    graphs_after = t.compiled_graphs()
    tmp = None
    path = a.trace_out
    if not path:
        tmp = tempfile.mkdtemp(prefix="gpipe-profile-")
        path = os.path.join(tmp, "trace.json")
    try:
        t0 = time.perf_counter()
        prof.export_chrome_trace(path)
        events = oc.load_trace(path)
        res = oc.analyze_trace(events, a.steps, STEP_MARKER)
        if t.cuda and res["kind"] != "cuda":
            # kineto says nothing when CUPTI cannot record (no permission to the GPU's
            # counters, a CUPTI that does not match the driver): a trace of CPU ops only
            raise bench.Unavailable("torch.profiler recorded no CUDA kernels (is CUPTI usable here? "
                                    "torch %s, %d trace events)" % (torch.__version__, len(events)))
        res["analysis_s"] = round(time.perf_counter() - t0, 1)
        res["trace_events"] = len(events)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    last = float(loss.item())
    res.update({
        "variant": a.variant, "precision": a.precision, "batch": a.batch,
        "autocast": "bfloat16" if a.precision == "bf16" else None,
        "warmup_steps": a.warmup, "warmup_step_s": [round(w, 4) for w in warm_times],
        "unprofiled_step_ms": [round(s * 1e3, 4) for s in times],
        "unprofiled_median_step_ms": statistics.median(times) * 1e3,
        "step_timing": "CUDA events" if t.cuda else "perf_counter",
        "first_loss": first, "last_loss": last,
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(t.dev) if t.cuda else platform.processor() or "cpu",
        "activities": [str(x).split(".")[-1] for x in activities],
        "kineto": bool(torch.autograd.kineto_available()) if hasattr(torch.autograd, "kineto_available") else None,
    })
    res.update(t.layout)
    if a.trace_out:
        res["trace"] = os.path.abspath(a.trace_out)
    if a.variant == "compile":
        res["compile_mode"] = a.compile_mode
        if graphs_before is not None and graphs_after is not None:
            res["graphs_compiled_while_profiled"] = graphs_after - graphs_before
    if t.cuda:
        res["allow_tf32"] = [torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32]
        res["cudnn_deterministic"] = torch.backends.cudnn.deterministic
    if last != last or abs(last) == float("inf"):
        res["error"] = "loss became %r" % last
    return res


def torch_side(args):
    warmup = max(args.warmup, 3) if args.torch_variant == "compile" else args.warmup
    cmd = [sys.executable, PROFILE_PY, "_torch", "--model", args.model,
           "--precision", args.precision, "--variant", args.torch_variant, "--device", args.device,
           "--batch", str(args.batch), "--warmup", str(warmup), "--steps", str(args.steps),
           "--lr", repr(args.lr), "--momentum", repr(args.momentum),
           "--compile-mode", args.compile_mode]
    cmd += ["--tiny"] if args.tiny else []
    cmd += ["--deterministic"] if args.torch_deterministic else []
    cmd += ["--trace-out", os.path.abspath(args.torch_trace)] if args.torch_trace else []
    log("PyTorch %s: %d warm-up steps, %d timed, %d profiled" % (
        bench.VARIANT_SHORT[args.torch_variant], warmup, args.steps, args.steps))
    res = worker_result(*run(cmd, args.timeout))
    res["command"] = quote(cmd)
    if res.get("error"):
        log("PyTorch: %s" % res["error"])
    else:
        log("PyTorch: %.3f ms per step profiled (%.3f ms without the profiler), %d trace events, "
            "analysed in %.1f s" % (res["step_ms"], res["unprofiled_median_step_ms"], res["trace_events"],
                                   res["analysis_s"]))
    return res


# --------------------------------------------------------------------------
# gpipe-onnx side: the per-layer profile and a training run
# --------------------------------------------------------------------------
def gpipe_side(args, workdir):
    out = {}
    onnx_path = os.path.join(workdir, "%s%s.onnx" % (args.model, "-tiny" if args.tiny else ""))
    info, error = export(args, args.model, onnx_path)
    if error:
        out["error"] = error
        return out
    out["onnx"] = info
    # 1. The per-layer profile. balance times the layers at micro-batch B/chunks on the first
    # device of --devices; its split is irrelevant here (one device, one stage).
    prof_path = os.path.join(workdir, "%s-%s.profile.json" % (args.model, args.precision))
    cmd = [args.gpipe, "balance", onnx_path, "--devices", args.gpipe_device, "--batch", str(args.batch),
           "--chunks", str(args.chunks), "--precision", args.precision, "--repeats", str(args.repeats),
           "--profile-out", prof_path]
    log("gpipe-onnx per-layer profile: %s" % quote(cmd))
    rc, so, se, secs = run(cmd, args.timeout)
    out["profile_command"] = quote(cmd)
    out["profile_s"] = round(secs, 1)
    if rc is None:
        out["error"] = "gpipe-onnx balance timed out after %.0f s" % secs
        return out
    if rc != 0:
        out["error"] = "gpipe-onnx balance failed: " + error_line(se, "exit status %d" % rc)
        out["stderr_tail"] = se[-4000:]
        return out
    try:
        with open(prof_path) as f:
            profile = json.load(f)
        if not all(isinstance(layer["op"], str) and float(layer["forward_ms"]) >= 0 and
                   float(layer["backward_ms"]) >= 0 for layer in profile["layers"]):
            raise ValueError("a layer without its op or with a negative time")
    except (OSError, ValueError, KeyError, TypeError) as e:
        out["error"] = "gpipe-onnx balance wrote no readable profile (%s): %s" % (prof_path, e)
        return out
    out["profile"] = profile
    out["balance_report"] = so
    g = oc.gpipe_classes(profile, args.model, args.chunks)
    out.update(g)
    log("gpipe-onnx: %d layers, %.3f ms of forward and backward per step (%d micro-batch%s of %d)" % (
        g["layers"], g["layers_ms"], args.chunks, "es" if args.chunks > 1 else "", profile["micro_batch"]))
    if args.save_profile:
        shutil.copyfile(prof_path, args.save_profile)
    # 2. The real step: bench.py's gpipe-onnx run (same flags, same metrics).
    extra = args.gpipe_args + ((" --chunks %d" % args.chunks) if args.chunks > 1 else "")
    gargs = types.SimpleNamespace(gpipe=args.gpipe, warmup=args.warmup, steps=args.steps,
                                  gpipe_devices=args.gpipe_device, lr=args.lr, momentum=args.momentum,
                                  gpipe_verbose=args.gpipe_verbose, gpipe_args=extra, timeout=args.timeout)
    train = bench.gpipe_side(gargs, args.model, args.precision, args.batch, onnx_path, workdir)
    train["command"] = quote(train.get("command") or [])
    out["train"] = train
    if train.get("error"):
        out["error"] = train["error"]
        return out
    out["step_ms"] = train["median_step_s"] * 1e3
    out["remainder_ms"] = out["step_ms"] - g["layers_ms"]
    log("gpipe-onnx: %.3f ms per step (median of %d), %.3f ms of it outside the profiled layers" % (
        out["step_ms"], train["timed_steps"], out["remainder_ms"]))
    return out


# --------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------
# (key, kind): "class" is a class on both sides; "torch" a class only PyTorch's side separates
# (gpipe-onnx: inside a subtotal row); "subtotal" a sum of rows shown above it, not added again;
# "remainder" a class gpipe-onnx's profile leaves out (its time is in the `not_profiled` row).
ROWS = [("conv_fwd", "class"), ("conv_dgrad", "torch"), ("conv_wgrad", "torch"),
        ("conv_bwd_unattributed", "torch"), ("conv_bwd", "subtotal")] + \
    [(k, "class") for k in ("gemm", "attention", "norm", "softmax", "elementwise", "reduction", "pooling",
                            "embedding", "copies", "other", "loss")] + \
    [("optimizer", "remainder"), ("idle", "remainder"), ("not_profiled", "subtotal"), ("step", "total")]
ROW_LABEL = dict(oc.CLASSES)
ROW_LABEL.update({
    "conv_bwd": "= convolution backward, data + weight gradient",
    "not_profiled": "= loss + optimizer + idle (what gpipe-onnx's per-layer profile leaves out)",
    "step": "step",
})


def row_values(torch_res, gp):
    """{row key: (PyTorch ms or None, gpipe-onnx ms or None, gpipe-onnx note)} per step."""
    tc = torch_res.get("classes") if torch_res and not torch_res.get("error") else None
    gok = gp and "classes" in gp
    gc = gp["classes"] if gok else {}
    vals = {}
    for key, kind in ROWS:
        t = g = None
        note = ""
        if tc is not None:
            if key == "conv_bwd":
                t = sum(tc.get(k, 0.0) for k in oc.CONV_BWD)
            elif key == "not_profiled":
                t = tc.get("loss", 0.0) + tc.get("optimizer", 0.0) + tc.get("idle", 0.0)
            elif key == "step":
                t = torch_res["step_ms"]
            else:
                t = tc.get(key, 0.0)
        if gok:
            if kind == "torch":
                note = "in the data + weight row"
            elif kind == "remainder":
                note = "in the loss + optimizer + idle row"
            elif key == "not_profiled":
                if "remainder_ms" in gp:
                    g = gp["remainder_ms"] + gc.get("loss", {}).get("ms", 0.0)
            elif key == "step":
                g = gp.get("step_ms")
            else:
                g = gc.get(key, {}).get("ms", 0.0)
                if key == "loss":
                    if g:
                        note = "the loss folded into the model; its mean is in the loss + optimizer + idle row"
                    else:
                        g, note = None, "in the loss + optimizer + idle row"
        vals[key] = (t, g, note)
    return vals


def fmt_ms(v):
    return "%.3f" % v if v is not None else ""


def fmt_pct(v, total):
    return "%.1f%%" % (100.0 * v / total) if v is not None and total else ""


def table_lines(torch_res, gp):
    vals = row_values(torch_res, gp)
    t_step = vals["step"][0]
    g_step = vals["step"][1]
    lines = ["| class | PyTorch ms/step | PyTorch % | gpipe-onnx ms/step | gpipe-onnx % | gpipe-onnx / PyTorch |",
             "|---|---:|---:|---:|---:|---:|"]
    for key, kind in ROWS:
        t, g, note = vals[key]
        # rows with nothing on either side (attention in a convolution net, ...) are left out
        if key != "step" and not (t and t >= 0.0005) and not (g and abs(g) >= 0.0005):
            continue
        label = md_cell(ROW_LABEL[key])
        if kind in ("subtotal", "total"):
            label = "**%s**" % label
        gcell = fmt_ms(g) if g is not None else md_cell(note)
        # no ratio of a negative remainder or of a class one side does not have
        ratio = "%.2fx" % (g / t) if t and t > 0 and g and g > 0 else ""
        lines.append("| %s | %s | %s | %s | %s | %s |" % (
            label, fmt_ms(t), fmt_pct(t, t_step), gcell, fmt_pct(g, g_step) if g is not None else "", ratio))
    return lines


def legend_lines(args, torch_res, gp):
    """What each side ran and what each row holds."""
    out = []
    tr = torch_res if torch_res and not torch_res.get("error") else None
    cpu = args.device == "cpu"
    if tr:
        layout = ", ".join("%s %s" % (k.replace("_", " "), tr[k]) for k in ("memory_format", "attention") if tr.get(k))
        out.append("- PyTorch side: %s%s; %d warm-up steps, then %d steps under torch.profiler (%s); the classes "
                   "are %s" % (bench.VARIANT_TITLE[args.torch_variant], " (%s)" % layout if layout else "",
                               tr["warmup_steps"], tr["steps"], " + ".join(tr["activities"]),
                               "the self times of its CPU ops (on a CPU: no kernels to count)" if tr["kind"] == "cpu"
                               else "its CUDA kernels', copies' and memsets' GPU times"))
        out.append("- PyTorch step: %s divided by %d; without the profiler the step took %.3f ms (%s, "
                   "median of %d); idle: %s" % (
                       "the span of the profiled steps" if cpu else "the span of the profiled steps on the GPU, "
                       "from the first kernel's start to the last one's end", tr["steps"],
                       tr["unprofiled_median_step_ms"], tr["step_timing"], len(tr["unprofiled_step_ms"]),
                       "the part of that span with no kernel running (a kernel waiting for the host, the "
                       "profiler's own cost)" if not cpu else "the part of the steps in no op (Python, "
                       "the autograd engine)"))
        if tr.get("overlap_ms", 0) > 0.01 * tr["step_ms"]:
            out.append("- PyTorch: %.3f ms per step of kernels ran concurrently on other streams: they count in "
                       "their classes, so the classes add up to more than the step" % tr["overlap_ms"])
        if tr.get("unlinked_ms", 0) > 0:
            out.append("- PyTorch: %.3f ms per step of kernels had no launching op in the trace: classified by "
                       "name alone" % tr["unlinked_ms"])
        a = tr.get("conv_backward_attribution_ms") or {}
        if sum(a.values()) > 0:
            out.append("- PyTorch convolution backward: %.3f ms per step told dgrad from wgrad by the kernel's name, "
                       "%.3f ms by its position in aten::convolution_backward (ATen computes the data gradient "
                       "first), %.3f ms by neither" % (a.get("name", 0), a.get("position", 0), a.get("none", 0)))
    if gp and "classes" in gp:
        prof = gp["profile"]
        out.append("- gpipe-onnx: per-layer profile `%s` (%d layers, micro-batch %d, on %s: every layer's forward "
                   "and backward timed alone inside training steps of the model as one stage, the device waited "
                   "for after each layer; median of %d)" % (
                       md_cell(gp["profile_command"]), gp["layers"], prof["micro_batch"], prof["device"],
                       args.repeats))
        if "step_ms" in gp:
            out.append("- gpipe-onnx step: the median step time of `gpipe-onnx train ... --metrics` (%d warm-up, "
                       "%d timed steps: its wall time, data copy, forward, loss, backward, optimizer and the loss "
                       "read back); the profiled layers add up to %.3f ms of it (%s), the rest is the "
                       "loss + optimizer + idle row" % (
                           args.warmup, gp["train"]["timed_steps"], gp["layers_ms"],
                           fmt_pct(gp["layers_ms"], gp["step_ms"])))
            if gp["remainder_ms"] < 0:
                out.append("- gpipe-onnx: the profiled layers add up to more than the step: the per-layer "
                           "timing's wait after every layer (and, with CUDA graphs, the launches a graph "
                           "saves) costs more than the step's loss, optimizer and gaps, so that row is negative")
        if "loss" in gp["classes"]:
            out.append("- gpipe-onnx loss row: the layers of the loss folded into the exported model (%s; "
                       "export.py); the mean `--loss output` takes of them is in the loss + optimizer + idle "
                       "row" % ", ".join(oc.FOLDED_LOSS_OPS.get(args.model, ())))
        if args.chunks > 1:
            out.append("- gpipe-onnx: %d micro-batches: each class is %d x the profile's micro-batch time; a "
                       "checkpointed micro-batch's recomputation is not in the profile (in the remainder)" % (
                           args.chunks, args.chunks))
        if args.precision == "bf16":
            out.append("- gpipe-onnx bf16: casts run inside the layers (staged float32 copies for convolution "
                       "and Softmax backward, the bfloat16 weight copies of the step in the first layer's "
                       "forward): its copies row cannot hold them, unlike PyTorch's (autocast's casts)")
        if "--fast-conv" in shlex.split(args.gpipe_args):
            out.append("- WARNING: --fast-conv reaches `gpipe-onnx train` only: `balance` has no such flag, so "
                       "the profiled convolutions ran cuDNN's default (deterministic) algorithms and the step "
                       "time the fastest ones")
        byc = {}
        for op, o in sorted(gp["ops"].items()):
            for d in ("forward", "backward"):
                byc.setdefault(o[d + "_class"], []).append("%s %s x%d" % (op, d, o["layers"]))
        parts = []
        for key, _ in oc.CLASSES:
            if key in byc:
                parts.append("%s: %s" % (key, ", ".join(byc[key])))
        if "conv_bwd" in byc:
            parts.append("conv_bwd: %s" % ", ".join(byc["conv_bwd"]))
        out.append("- gpipe-onnx layers per class (ONNX op, direction, layers): %s" % "; ".join(parts))
    out.append("- PyTorch's kernels: each in the class of the first rule of op_classes.KERNEL_RULES that "
               "matches its name and the ops that launched it (the JSON lists every kernel name with its "
               "class, rule and launching op, per step)")
    out.append("- gpipe-onnx's profile times a layer's backward as one: a convolution's data and weight "
               "gradients together, in the 'data + weight' row only; PyTorch's are apart (cuDNN's kernel "
               "names say dgrad or wgrad); that row sums its three rows above. gpipe-onnx's profile has "
               "no optimizer, loss (except the U-Net's folded softplus) or idle time: the step minus the "
               "profiled layers is the 'loss + optimizer + idle' row, PyTorch's three rows summed beside it")
    out.append("- ratio: gpipe-onnx's time over PyTorch's (above 1: gpipe-onnx slower in that class); "
               "%: of that side's step")
    out.append("- %s" % bench.PRECISION_TEXT[args.precision])
    return out


def write_outputs(args, doc):
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(args.out + ".tmp", args.out)
    if args.markdown:
        h = doc["header"]
        lines = ["## Profile: %s %s, batch %d: PyTorch %s beside gpipe-onnx, time per op class" % (
                     args.model, args.precision, args.batch, bench.VARIANT_SHORT[args.torch_variant]), "",
                 "- device: %s" % h["device"],
                 "- date: %s" % h["date"],
                 "- torch %s; gpipe-onnx --version: %s" % (h["torch"], h["gpipe_version"]),
                 "- command: `%s`" % md_cell(h["command"])]
        lines += status_lines(doc)
        lines += legend_lines(args, doc.get("torch"), doc.get("gpipe")) + [""]
        lines += table_lines(doc.get("torch"), doc.get("gpipe"))
        with open(args.markdown + ".tmp", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(args.markdown + ".tmp", args.markdown)


def status_lines(doc):
    out = []
    for side, title in (("torch", "PyTorch"), ("gpipe", "gpipe-onnx")):
        r = doc.get(side)
        if r is None:
            out.append("- %s: not run" % title)
        elif r.get("error"):
            out.append("- %s: %s" % (title, md_cell(r["error"])))
    return out


# --------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------
# gpipe-onnx train flags profile.py sets itself (both sides must agree on them)
OWN_FLAGS = ("--batch", "--chunks", "--devices", "--precision", "--tf32", "--steps", "--epochs", "--synthetic",
             "--metrics", "--loss", "--optimizer", "--lr", "--momentum", "--data", "--labels")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_torch":
        return torch_worker(sys.argv[2:])
    set_log_prefix("profile")
    ap = argparse.ArgumentParser(
        description="Side-by-side profile of one training step: PyTorch (torch.profiler, GPU time per "
                    "kernel class) beside gpipe-onnx (its per-layer profile by ONNX op, and its step time), "
                    "per op class. See bench/README.md, 'Profile'.")
    ap.add_argument("model", choices=MODELS, help="resnet50, gpt2 or unet (bench/models.py)")
    ap.add_argument("precision", choices=bench.PRECISIONS, help="fp32, tf32 or bf16, as in bench.py")
    ap.add_argument("--batch", type=int, default=None, help="mini-batch (default: the benchmark's, bench/models.py)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps on both sides (default 5; 2 with --tiny)")
    ap.add_argument("--steps", type=int, default=None,
                    help="PyTorch: steps timed without, then with the profiler; gpipe-onnx: timed train "
                         "steps (default 10; 2 with --tiny)")
    ap.add_argument("--torch-variant", default="best", choices=bench.TORCH_VARIANTS,
                    help="eager (the model as exported), best (channels_last for the convolution nets, SDPA "
                         "for GPT-2; the default) or compile (torch.compile of best)")
    ap.add_argument("--compile-mode", default="default", choices=bench.COMPILE_MODES,
                    help="torch.compile mode with --torch-variant compile")
    ap.add_argument("--torch-deterministic", action="store_true",
                    help="PyTorch with cuDNN's deterministic algorithms only, as gpipe-onnx's default")
    ap.add_argument("--torch-trace", default=None, metavar="FILE",
                    help="keep PyTorch's profiler trace (Chrome trace JSON, for Perfetto)")
    ap.add_argument("--no-torch", action="store_true", help="gpipe-onnx's side only")
    ap.add_argument("--gpipe", default=None, metavar="BINARY", help="the gpipe-onnx binary (without it: PyTorch only)")
    ap.add_argument("--gpipe-device", default=None, help="gpipe-onnx's device (default cuda:0; cpu:0 with --device cpu)")
    ap.add_argument("--gpipe-args", default="", help="extra `gpipe-onnx train` flags, e.g. '--cuda-graph off'")
    ap.add_argument("--gpipe-verbose", action="store_true", help="gpipe-onnx train without --quiet, its output echoed")
    ap.add_argument("--chunks", type=int, default=1,
                    help="gpipe-onnx micro-batches per step, for both its profile and its run (default 1)")
    ap.add_argument("--repeats", type=int, default=3, help="gpipe-onnx balance --repeats: timed runs per layer (3)")
    ap.add_argument("--save-profile", default=None, metavar="FILE", help="keep gpipe-onnx's per-layer profile JSON")
    ap.add_argument("--lr", type=float, default=0.01, help="SGD learning rate, both sides (0.01)")
    ap.add_argument("--momentum", type=float, default=0.9, help="SGD momentum, both sides (0.9)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="PyTorch's device (default cuda; cpu: profiles CPU ops, gpipe-onnx on cpu:0)")
    ap.add_argument("--tiny", action="store_true", help="the tiny models (smoke test)")
    ap.add_argument("--onnx-dir", default=None, help="keep the exported model here (default: a temp dir)")
    ap.add_argument("--reuse-onnx", action="store_true", help="reuse the model already in --onnx-dir")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per export / run (1800)")
    ap.add_argument("--out", default=None, help="everything as JSON")
    ap.add_argument("--markdown", default=None, help="the table and its header as Markdown")
    args = ap.parse_args()

    import models as bm
    if args.batch is None:
        args.batch = bm.config(args.model, args.tiny)["batch"]
    if args.warmup is None:
        args.warmup = 2 if args.tiny else 5
    if args.steps is None:
        args.steps = 2 if args.tiny else 10
    if args.batch < 1 or args.steps < 1 or args.warmup < 0 or args.repeats < 1 or args.chunks < 1:
        ap.error("--batch, --steps, --repeats and --chunks must be >= 1, --warmup >= 0")
    if args.batch % args.chunks:
        ap.error("--chunks %d does not divide --batch %d" % (args.chunks, args.batch))
    if args.device == "cpu" and args.precision == "tf32":
        ap.error("tf32 needs a GPU (fp32 or bf16 with --device cpu)")
    if args.gpipe_device is None:
        args.gpipe_device = "cpu:0" if args.device == "cpu" else "cuda:0"
    if "," in args.gpipe_device:
        ap.error("--gpipe-device is one device: the profile adds up layers of one stage")
    if args.gpipe:
        if not os.path.isfile(args.gpipe) or not os.access(args.gpipe, os.X_OK):
            ap.error("--gpipe %s: no such executable (build it: meson setup build && ninja -C build)" % args.gpipe)
        args.gpipe = os.path.abspath(args.gpipe)
        for flag in shlex.split(args.gpipe_args):
            if flag.split("=")[0] in OWN_FLAGS:
                ap.error("--gpipe-args %s: profile.py sets that flag itself (--batch, --chunks, --warmup, "
                         "--steps, --lr, --momentum and the precision are its own options)" % flag)
    if args.no_torch and not args.gpipe:
        ap.error("--no-torch without --gpipe: nothing to profile")
    if args.reuse_onnx and not args.onnx_dir:
        ap.error("--reuse-onnx needs --onnx-dir")

    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        if not args.no_torch or args.gpipe:       # export.py needs torch too
            ap.error("this Python (%s) has no torch: PyTorch's side and the export need it" % sys.executable)
        torch_version = "not installed"
    header = {
        "device": device_name(args),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch_version,
        "python": platform.python_version(),
        "gpipe_version": gpipe_version(args.gpipe) if args.gpipe else "not run",
        "command": quote([sys.executable] + sys.argv),
        "config": {k: getattr(args, k) for k in ("model", "precision", "batch", "warmup", "steps", "torch_variant",
                                                 "compile_mode", "torch_deterministic", "gpipe_device", "gpipe_args",
                                                 "chunks", "repeats", "lr", "momentum", "device", "tiny")},
        "step_marker": STEP_MARKER,
        "rules": [{"class": c, "name": n, "ops": o, "why": w} for c, n, o, w in oc.KERNEL_RULES],
    }
    log("%s %s, batch %d on %s; torch %s; gpipe-onnx --version: %s" % (args.model, args.precision, args.batch, header["device"],
                                                           torch_version, header["gpipe_version"]))
    doc = {"header": header, "model": args.model, "precision": args.precision, "batch": args.batch,
           "torch": None, "gpipe": None}
    t_all = time.time()
    tmp = None
    workdir = args.onnx_dir
    if workdir:
        os.makedirs(workdir, exist_ok=True)
    else:
        tmp = workdir = tempfile.mkdtemp(prefix="gpipe-profile-")
    try:
        if not args.no_torch:
            doc["torch"] = torch_side(args)
            write_outputs(args, doc)
        if args.gpipe:
            doc["gpipe"] = gpipe_side(args, workdir)
            if doc["gpipe"].get("error"):
                log("gpipe-onnx: %s" % doc["gpipe"]["error"])
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    doc["table"] = dict((k, {"torch_ms": t, "gpipe_ms": g, "gpipe_note": n})
                        for k, (t, g, n) in row_values(doc["torch"], doc["gpipe"]).items())
    write_outputs(args, doc)
    log("done in %.0f s" % (time.time() - t_all))
    print("")
    print("\n".join(status_lines(doc) + [""] + table_lines(doc["torch"], doc["gpipe"])), flush=True)
    print("")
    print("\n".join(legend_lines(args, doc["torch"], doc["gpipe"])), flush=True)
    failed = [s for s in ("torch", "gpipe") if doc[s] and doc[s].get("error")]
    return 1 if failed else 0


