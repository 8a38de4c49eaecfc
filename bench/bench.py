#!/usr/bin/env python3
"""Training throughput: gpipe-onnx beside PyTorch's eager, best-layout and compiled
training of the same models, same batch, same GPU, in one run.

    python3 bench/bench.py --gpipe build/src/gpipe-onnx \\
        [--models resnet50,unet,gpt2] [--precision fp32,tf32,bf16] \\
        [--torch-variants eager,best,compile] [--warmup 10] [--steps 30] \\
        [--out results.json] [--markdown results.md]

    Smoke test of every code path (tiny models, 2 steps per run, a GPU if there is one):
    python3 bench/bench.py --smoke [--gpipe build-cpu/src/gpipe-onnx]

For every model and precision: PyTorch trains the model (models.py) with SGD on one
fixed synthetic batch, one subprocess per variant: eager (the model as exported), best
layout (channels_last for the convolution nets, F.scaled_dot_product_attention for
GPT-2) and torch.compile of the best-layout model; gpipe-onnx trains the same model
exported to ONNX (export.py) on synthetic data of the same shapes with the same
optimizer. All report the median samples/s of the timed steps after the warm-up steps,
PyTorch also its peak GPU memory. See bench/README.md.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# Shared with pipeline.py and profile.py.
from common import (LOSS, MODELS, PRECISIONS, device_name, export, fmt_rate,  # noqa: E402
                    gpipe_run, last_line, log, md_cell, run, summarize, worker_result)


# --------------------------------------------------------------------------
# PyTorch side: runs in its own process (`bench.py _torch ...`), prints one JSON line
# --------------------------------------------------------------------------
TORCH_VARIANTS = ("eager", "best", "compile")
VARIANT_TITLE = {"eager": "PyTorch eager", "best": "PyTorch best layout",
                 "compile": "PyTorch compiled"}
VARIANT_SHORT = {"eager": "eager", "best": "best layout", "compile": "compiled"}
# What "best layout" means for each model (the compiled variant compiles that model).
BEST_LAYOUT = {"resnet50": "channels_last", "unet": "channels_last", "gpt2": "SDPA"}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class Unavailable(Exception):
    """A variant this torch or device cannot run; its message goes into the table as is."""


def short_error(e, limit=240):
    """One line for a table cell: the exception's type and the first line of its message."""
    if isinstance(e, (Unavailable, SystemExit)):
        text = str(e)
    else:
        lines = [l.strip() for l in str(e).splitlines() if l.strip()]
        first = lines[0] if lines else ""
        text = type(e).__name__ + (": " + first if first else "")
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def torch_worker(argv):
    ap = argparse.ArgumentParser(prog="bench.py _torch")
    ap.add_argument("--model", required=True)
    ap.add_argument("--precision", required=True, choices=PRECISIONS)
    ap.add_argument("--variant", default="eager", choices=TORCH_VARIANTS)
    ap.add_argument("--compile-mode", default="default", choices=COMPILE_MODES)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--warmup", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--momentum", type=float, required=True)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--sdpa", action="store_true", help="GPT-2's eager variant uses SDPA too")
    ap.add_argument("--deterministic", action="store_true",
                    help="cuDNN's deterministic algorithms only (torch.backends.cudnn.deterministic)")
    a = ap.parse_args(argv)

    import warnings
    warnings.filterwarnings("ignore")
    try:
        res = torch_train(a)
    except Exception as e:               # reported in the table, the driver goes on
        if not isinstance(e, Unavailable):
            import traceback
            traceback.print_exc()
        res = {"error": short_error(e)}
    print("RESULT " + json.dumps(res), flush=True)


def torch_setup(a):
    """The PyTorch side of one run, built as bench.py trains it: the model of models.py in
    the variant's layout (compiled for `compile`), SGD, one fixed synthetic batch on the
    device, the precision's flags and autocast. `a` has the fields of `bench.py _torch`'s
    arguments. Returns a namespace: step() (one training step: forward and loss under
    autocast for bf16, backward, SGD, zero_grad; returns the loss tensor), sync() (waits
    for the device), compiled_graphs() (graphs dynamo and AOTAutograd compiled so far, None
    without dynamo), cuda, dev, model (uncompiled), layout (what the JSON says of it),
    version. Raises Unavailable for what this torch or device cannot run. Shared with
    profile.py, so that its profile is of exactly this step."""
    import contextlib
    import types
    import torch
    import torch.nn.functional as F
    import models as bm

    version = torch.__version__.split("+")[0]
    cuda = a.device.startswith("cuda")
    best = a.variant in ("best", "compile")
    if a.variant == "compile" and not hasattr(torch, "compile"):
        raise Unavailable("torch.compile needs torch >= 2.0 (this is torch %s)" % version)
    if cuda:
        if not torch.cuda.is_available():
            raise Unavailable("no CUDA device (torch %s)" % torch.__version__)
        dev = torch.device("cuda:0")
        torch.cuda.set_device(dev)
        # TF32 for tf32, and for bf16 too (whatever autocast leaves in float32, as a
        # PyTorch user on this hardware would have it); off for fp32.
        tf32 = a.precision in ("tf32", "bf16")
        torch.backends.cudnn.benchmark = True
        # --deterministic: only cuDNN's deterministic algorithms, as gpipe-onnx by default.
        torch.backends.cudnn.deterministic = a.deterministic
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        if a.precision == "bf16" and not torch.cuda.is_bf16_supported():
            raise Unavailable("bf16 not supported on %s" % torch.cuda.get_device_name(dev))
        torch.cuda.reset_peak_memory_stats(dev)
    else:
        dev = torch.device("cpu")
        if a.precision == "tf32":
            raise Unavailable("tf32 needs a GPU")

    model = bm.build(a.model, a.tiny)
    layout = {}
    conv_net = a.model in ("resnet50", "unet")
    if a.model == "gpt2":
        sdpa = best or a.sdpa
        if sdpa:
            if not hasattr(F, "scaled_dot_product_attention"):
                raise Unavailable("F.scaled_dot_product_attention needs torch >= 2.0 "
                                  "(this is torch %s)" % version)
            model.use_sdpa(True)
        layout["attention"] = "F.scaled_dot_product_attention(is_causal=True)" if sdpa else \
            "explicit masked softmax"
    memory_format = torch.channels_last if (best and conv_net) else torch.contiguous_format
    if conv_net:
        layout["memory_format"] = "channels_last" if best else "NCHW (contiguous)"
    model = model.to(dev, memory_format=memory_format).train()
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    x, y = bm.make_batch(a.model, a.batch, a.tiny, dev)
    if conv_net:
        x = x.contiguous(memory_format=memory_format)
    run_model = model
    if a.variant == "compile":
        kw = {} if a.compile_mode == "default" else {"mode": a.compile_mode}
        run_model = torch.compile(model, **kw)

    if a.precision == "bf16":
        # bf16 compute for forward and loss, float32 master weights and SGD.
        def amp():
            return torch.autocast(device_type=dev.type, dtype=torch.bfloat16)
    else:
        amp = contextlib.nullcontext

    def step():
        with amp():
            out = run_model(x)
            loss = bm.loss(a.model, out, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def compiled_graphs():
        """Graphs dynamo and AOTAutograd have compiled so far (None without dynamo)."""
        if a.variant != "compile":
            return None
        try:
            from torch._dynamo.utils import counters
            return int(counters["stats"]["unique_graphs"]) + int(counters["aot_autograd"]["total"])
        except Exception:
            return None

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    return types.SimpleNamespace(step=step, sync=sync, compiled_graphs=compiled_graphs, cuda=cuda,
                                 dev=dev, model=model, layout=layout, version=version)


def torch_warmup(t, n):
    """n warm-up steps of torch_setup's `t`, each waited for, so that compilation (the
    compiled variant's first steps) and cuDNN's algorithm search end before whatever is
    timed next. (first step's loss or None, seconds of each step)"""
    first = None
    warm_times = []
    for i in range(n):
        t0 = time.perf_counter()
        loss = t.step()
        t.sync()
        warm_times.append(time.perf_counter() - t0)
        if i == 0:
            first = float(loss.item())
    t.sync()
    return first, warm_times


def torch_time(t, n):
    """n timed steps of torch_setup's `t`: (seconds of each step, wall seconds of all,
    the last loss tensor)."""
    import torch
    times = []
    t_start = time.perf_counter()
    if t.cuda:
        # One event per step boundary, no synchronization between steps: the host
        # queues ahead as it would in a training loop; each step's time is the GPU
        # time between its boundaries.
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
        ev[0].record()
        for i in range(n):
            loss = t.step()
            ev[i + 1].record()
        t.sync()
        times = [ev[i].elapsed_time(ev[i + 1]) / 1000.0 for i in range(n)]
    else:
        for i in range(n):
            t0 = time.perf_counter()
            loss = t.step()
            times.append(time.perf_counter() - t0)
    return times, time.perf_counter() - t_start, loss


def torch_train(a):
    import torch
    import models as bm

    t = torch_setup(a)
    cuda, dev, model = t.cuda, t.dev, t.model
    first, warm_times = torch_warmup(t, a.warmup)
    graphs_before = t.compiled_graphs()
    times, wall, loss = torch_time(t, a.steps)
    graphs_after = t.compiled_graphs()
    last = float(loss.item())
    if first is None:
        first = last
    res = summarize(a.batch, times) or {}
    res.update({
        "variant": a.variant,
        "precision": a.precision,
        "autocast": "bfloat16" if a.precision == "bf16" else None,
        "wall_samples_per_s": a.batch * a.steps / wall if wall > 0 else None,
        "warmup_steps": a.warmup,
        "warmup_step_s": [round(w, 4) for w in warm_times],
        "first_loss": first, "last_loss": last,
        "parameters": bm.param_count(model),
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(dev) if cuda else platform.processor() or "cpu",
    })
    res.update(t.layout)
    if a.variant == "compile":
        res["compile_mode"] = a.compile_mode
        if warm_times:
            res["first_step_s"] = round(warm_times[0], 2)     # includes the compilation
        if graphs_before is not None and graphs_after is not None:
            res["graphs_compiled_in_warmup"] = graphs_before
            res["graphs_compiled_while_timed"] = graphs_after - graphs_before
    if cuda:
        res["max_memory_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2 ** 30, 2)
        res["allow_tf32"] = [torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32]
        res["cudnn_deterministic"] = torch.backends.cudnn.deterministic
    if last != last or abs(last) == float("inf"):
        res["error"] = "loss became %r" % last
    return res


# --------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------
def torch_side(args, name, precision, batch, variant):
    """One PyTorch variant in its own process (a free GPU, its own peak memory)."""
    warmup = args.compile_warmup if variant == "compile" else args.warmup
    cmd = [sys.executable, os.path.abspath(__file__), "_torch", "--model", name,
           "--precision", precision, "--variant", variant, "--device", args.device,
           "--batch", str(batch), "--warmup", str(warmup), "--steps", str(args.steps),
           "--lr", repr(args.lr), "--momentum", repr(args.momentum)]
    cmd += ["--tiny"] if args.tiny else []
    cmd += ["--sdpa"] if args.torch_sdpa else []
    cmd += ["--deterministic"] if args.torch_deterministic else []
    if variant == "compile":
        cmd += ["--compile-mode", args.compile_mode]
    what = "%s %s: %s" % (name, precision, VARIANT_TITLE[variant])
    if variant == "best":
        what += " (%s)" % BEST_LAYOUT[name]
    elif variant == "compile":
        what += " (torch.compile, mode %s, of the %s model)" % (args.compile_mode, BEST_LAYOUT[name])
    log("%s, batch %d, %d+%d steps" % (what, batch, warmup, args.steps))
    res = worker_result(*run(cmd, args.timeout))
    if res.get("error"):
        log("%s: %s" % (what, res["error"]))
    else:
        extra = ""
        if "max_memory_gib" in res:
            extra += ", peak %.2f GiB" % res["max_memory_gib"]
        if "first_step_s" in res:
            extra += ", first step (compilation) %.1f s" % res["first_step_s"]
        if res.get("graphs_compiled_while_timed"):
            extra += ", WARNING: %d graphs compiled during the timed steps" % res["graphs_compiled_while_timed"]
        log("%s: %.1f samples/s (median step %.4f s, loss %.4f -> %.4f%s)" % (
            what, res["samples_per_s"], res["median_step_s"], res["first_loss"],
            res["last_loss"], extra))
    return res


def gpipe_precision_flags(precision):
    """gpipe-onnx train's precision flags: none for fp32 (its default); --tf32 (the alias of
    --precision tf32, which builds without --precision also take) for tf32; --precision bf16."""
    if precision == "fp32":
        return []
    if precision == "tf32":
        return ["--tf32"]
    return ["--precision", precision]


def is_setting(word):
    """A NAME=VALUE word (NAME in capitals, as `env` takes them)."""
    return re.match(r"^[A-Z_][A-Z0-9_]*=", word) is not None


def variant_settings(text):
    """A --gpipe-variant's ARGS as (environment settings, flags): leading
    NAME=VALUE words set the variable for that run only; the rest are
    gpipe-onnx train flags."""
    words = shlex.split(text)
    settings = {}
    while words and is_setting(words[0]):
        k, _, v = words.pop(0).partition("=")
        settings[k] = v
    return settings, words


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
    cmd += gpipe_precision_flags(precision)
    if not args.gpipe_verbose:
        cmd.append("--quiet")
    cmd += shlex.split(args.gpipe_args)
    settings = {}
    if variant:
        settings, extra = variant_settings(variant[1])
        cmd += extra
    env = dict(os.environ, **settings) if settings else None
    what = "gpipe-onnx" + (" [%s]" % variant[0] if variant else "")
    log("%s %s: %s, batch %d, %d+%d steps: %s" % (
        name, precision, what, batch, args.warmup, args.steps,
        " ".join(shlex.quote(c) for c in ["%s=%s" % kv for kv in sorted(settings.items())] + cmd)))
    res, err = gpipe_run(cmd, metrics, args.timeout, args.warmup, batch, env=env)
    if args.gpipe_verbose and err:
        sys.stdout.write(err)
        sys.stdout.flush()
    if res.get("error"):
        log("%s %s: %s: %s" % (name, precision, what, res["error"]))
        return res
    log("%s %s: %s %.1f samples/s (median step %.4f s, loss %.4f -> %.4f%s)" % (
        name, precision, what, res["samples_per_s"], res["median_step_s"], res["first_loss"],
        res["last_loss"], ", planned %.2f GiB" % res["planned_gib"] if "planned_gib" in res else ""))
    if res.get("measured_problems"):
        log("%s %s: %s measured cuDNN's algorithms of %d problems first, in %.1f s" % (
            name, precision, what, res["measured_problems"], res["measure_s"]))
    return res


def ok(side):
    return bool(side) and not side.get("error") and bool(side.get("samples_per_s"))


def best_torch(row):
    """(variant, result) of the fastest PyTorch variant of a row that ran, or (None, None)."""
    runs = [(v, r) for v, r in (row.get("torch") or {}).items() if ok(r)]
    if not runs:
        return None, None
    return max(runs, key=lambda vr: vr[1]["samples_per_s"])


def ratio_of(t, g, name=None):
    if ok(t) and ok(g):
        return "%.2fx" % (g["samples_per_s"] / t["samples_per_s"]) + (" (vs %s)" % name if name else "")
    return "-"


def fmt_torch(args, name, side, variant):
    if side is None:
        return "not run"
    text = fmt_rate(side)
    if ok(side):
        if variant == "best":
            text += " (%s)" % BEST_LAYOUT[name]
        if side.get("graphs_compiled_while_timed"):
            text += " (recompiled while timed)"
    return text


def fmt_mem(side):
    if not ok(side):
        return "-"
    if side.get("max_memory_gib") is None:
        return "n/a (CPU)"
    return "%.2f" % side["max_memory_gib"]


def fmt_planned(side):
    """gpipe-onnx's planned device memory (common.read_metrics' planned_gib)."""
    if not ok(side) or side.get("planned_gib") is None:
        return "-"
    return "%.2f" % side["planned_gib"]


def table_lines(args, rows):
    """The results table (stdout and --markdown): per PyTorch variant its samples/s and
    peak memory, gpipe-onnx's samples/s and planned memory with its ratios to PyTorch
    eager and to the row's fastest PyTorch variant, and a column pair per --gpipe-variant."""
    tv = args.torch_variants
    head = "| model | precision | batch |"
    rule = "|---|---|---:|"
    for v in tv:
        head += " %s samples/s | %s peak GiB |" % (VARIANT_TITLE[v], VARIANT_SHORT[v])
        rule += "---:|---:|"
    head += " gpipe-onnx samples/s | gpipe-onnx planned GiB |"
    rule += "---:|---:|"
    if "eager" in tv:
        head += " gpipe-onnx / PyTorch eager |"
        rule += "---:|"
    if tv:
        head += " gpipe-onnx / best PyTorch |"
        rule += "---:|"
    for label, _ in args.variants:
        head += " gpipe-onnx %s samples/s |" % label
        rule += "---:|"
        if tv:
            head += " %s / best PyTorch |" % label
            rule += "---:|"
    lines = [head, rule]
    for r in rows:
        sides = r.get("torch") or {}
        g = r.get("gpipe")
        bv, bt = best_torch(r)
        line = "| %s | %s | %d |" % (r["model"], r["precision"], r["batch"])
        for v in tv:
            side = sides.get(v)
            line += " %s | %s |" % (fmt_torch(args, r["model"], side, v), fmt_mem(side))
        line += " %s | %s |" % (fmt_rate(g), fmt_planned(g))
        if "eager" in tv:
            line += " %s |" % ratio_of(sides.get("eager"), g)
        if tv:
            line += " %s |" % ratio_of(bt, g, VARIANT_SHORT.get(bv))
        for label, _ in args.variants:
            v = (r.get("variants") or {}).get(label)
            line += " %s |" % fmt_rate(v)
            if tv:
                line += " %s |" % ratio_of(bt, v, VARIANT_SHORT.get(bv))
        lines.append(line)
    return lines


# What each precision means on either side (the legends of bench.py and profile.py).
PRECISION_TEXT = {
    "fp32": "fp32: float32, TF32 off (`torch.backends.cuda.matmul.allow_tf32` and "
            "`torch.backends.cudnn.allow_tf32` False); gpipe-onnx without a precision flag",
    "tf32": "tf32: float32 storage, TF32 matrix products and convolutions (both flags "
            "True); gpipe-onnx `--tf32` (= `--precision tf32`)",
    "bf16": "bf16: `torch.autocast(device_type, dtype=torch.bfloat16)` around forward and "
            "loss, float32 master weights and SGD, TF32 allowed for what autocast keeps "
            "in float32; gpipe-onnx `--precision bf16`",
}


def legend_lines(args):
    """What the PyTorch columns are (under the table on stdout, above it in --markdown)."""
    out = []
    for p in args.precisions:
        out.append("- %s" % PRECISION_TEXT[p])
    cols = {
        "eager": ("PyTorch eager: the model as gpipe-onnx trains it (NCHW), except GPT-2's "
                  "attention: F.scaled_dot_product_attention (--torch-sdpa), not the exported "
                  "explicit masked softmax") if args.torch_sdpa else
                 ("PyTorch eager: the model as gpipe-onnx trains it (NCHW; GPT-2 with the "
                  "explicit masked-softmax attention that is exported)"),
        "best": "PyTorch best layout: eager with the layout a PyTorch user would pick: "
                "`channels_last` model and input for ResNet-50 and the U-Net, "
                "`F.scaled_dot_product_attention(is_causal=True)` for GPT-2's attention",
        "compile": "PyTorch compiled: `torch.compile` (mode %s) of the best-layout model, "
                   "%d warm-up step%s (compilation excluded from the timing)" % (
                       args.compile_mode, args.compile_warmup, "" if args.compile_warmup == 1 else "s"),
    }
    for v in args.torch_variants:
        out.append("- %s" % cols[v])
    if args.torch_variants:
        out.append("- peak GiB: `torch.cuda.max_memory_allocated` of that variant's own process; "
                   "best PyTorch: the fastest PyTorch column of the row")
    if args.gpipe:
        out.append("- gpipe-onnx planned GiB: the device memory its stages planned (parameters and "
                   "their gradients, optimizer state, activations, kernel workspaces: the --metrics "
                   "memory records, summed over stages); the CUDA context and what libraries "
                   "allocate for themselves are not in it")
    for v in args.variants:
        out.append("- variant %s: gpipe-onnx with `%s`" % v)
    return out


def write_outputs(args, header, rows):
    doc = dict(header)
    doc["results"] = rows
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(args.out + ".tmp", args.out)
    if args.markdown:
        lines = [
            "## gpipe-onnx vs PyTorch (eager, best layout, compiled): training throughput",
            "",
            "- device: %s" % header["device"],
            "- date: %s" % header["date"],
            "- torch %s; gpipe-onnx --version: %s" % (header["torch"], header["gpipe_version"]),
            "- command: `%s`" % md_cell(header["command"]),
            "- method: SGD (lr %g, momentum %g), synthetic data of the benchmark shapes (PyTorch "
            "repeats one batch, gpipe-onnx alternates two: their losses are not comparable); "
            "%d warm-up step(s), then the median samples/s of %d timed step(s) (PyTorch: %s per "
            "step; gpipe-onnx: its per-step metrics)" % (
                args.lr, args.momentum, args.warmup, args.steps,
                "CUDA events" if args.device == "cuda" else "perf_counter"),
        ] + legend_lines(args) + [""] + table_lines(args, rows)
        with open(args.markdown + ".tmp", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(args.markdown + ".tmp", args.markdown)


def parse_list(text, allowed, what, ap, aliases=None):
    items = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        item = (aliases or {}).get(item, item)
        if item == "all":
            items += [a for a in allowed if a not in items]
            continue
        if item not in allowed:
            ap.error("unknown %s '%s' (%s)" % (what, item, ", ".join(allowed)))
        if item not in items:
            items.append(item)
    return items


def cuda_available():
    """Whether torch sees a GPU (asked in a subprocess, so that this process never
    initializes CUDA)."""
    rc, out, _, _ = run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"], 120)
    return rc == 0 and last_line(out) == "True"


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_torch":
        return torch_worker(sys.argv[2:])
    ap = argparse.ArgumentParser(
        description="Training throughput of gpipe-onnx beside PyTorch (eager, best layout, "
                    "torch.compile) on our three benchmark models.")
    ap.add_argument("--models", default=",".join(("resnet50", "unet", "gpt2")),
                    help="comma-separated: resnet50, gpt2, unet (default: all three)")
    ap.add_argument("--precision", default=None,
                    help="comma-separated: fp32, tf32, bf16 or all (default fp32,tf32,bf16; "
                         "fp32 with --device cpu, fp32,bf16 with --smoke on a CPU)")
    ap.add_argument("--tf32", action="store_true", help="the same as --precision tf32")
    ap.add_argument("--warmup", type=int, default=None,
                    help="warm-up steps (default 10; 2 with --tiny, 1 with --smoke)")
    ap.add_argument("--steps", type=int, default=None,
                    help="timed steps (default 30; 3 with --tiny, 1 with --smoke)")
    ap.add_argument("--batch", default=None,
                    help="override batch sizes, e.g. resnet50=64,gpt2=8 (default: the targets')")
    ap.add_argument("--lr", type=float, default=0.01, help="SGD learning rate, both sides (0.01)")
    ap.add_argument("--momentum", type=float, default=0.9, help="SGD momentum, both sides (0.9)")
    ap.add_argument("--gpipe", default=None, help="the gpipe-onnx binary (without it: PyTorch only)")
    ap.add_argument("--gpipe-devices", default=None, help="gpipe-onnx --devices (default cuda:0; cpu:0 with --device cpu)")
    ap.add_argument("--gpipe-args", default="", help="extra gpipe-onnx train flags, e.g. '--chunks 4'")
    ap.add_argument("--gpipe-variant", action="append", default=[], metavar="LABEL=ARGS",
                    help="also run gpipe-onnx with these extra flags, in a column of its own, "
                         "e.g. 'fast-conv=--fast-conv' (repeatable); leading NAME=VALUE words set "
                         "environment variables for that run, e.g. 'res-sums=GP_BN_RES_SUMS=1'")
    ap.add_argument("--gpipe-verbose", action="store_true", help="no --quiet; echo gpipe-onnx's progress")
    ap.add_argument("--torch-variants", default=",".join(TORCH_VARIANTS),
                    help="PyTorch columns, comma-separated: eager (the model as exported), best "
                         "(channels_last for ResNet-50 and U-Net, SDPA for GPT-2), compile "
                         "(torch.compile of the best-layout model), all or none "
                         "(default eager,best,compile)")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch side (= --torch-variants none)")
    ap.add_argument("--torch-sdpa", action="store_true",
                    help="the eager column of gpt2 uses F.scaled_dot_product_attention too "
                         "(default: the explicit masked softmax, as exported)")
    ap.add_argument("--torch-deterministic", action="store_true",
                    help="PyTorch with cuDNN's deterministic algorithms only, as gpipe-onnx's default")
    ap.add_argument("--compile-mode", default="default", choices=COMPILE_MODES,
                    help="torch.compile mode of the compile column (default: default)")
    ap.add_argument("--compile-warmup", type=int, default=None,
                    help="warm-up steps of the compile column (default: --warmup, at least 3; "
                         "--warmup with --smoke): the compilation happens in these")
    ap.add_argument("--device", default=None, choices=("cuda", "cpu"),
                    help="PyTorch side's device (default cuda; with --smoke a GPU if torch sees one, else cpu)")
    ap.add_argument("--tiny", action="store_true", help="tiny models (CPU smoke test)")
    ap.add_argument("--smoke", action="store_true",
                    help="exercise every code path fast: tiny models, 1 warm-up + 1 timed step "
                         "per run, on a GPU if there is one, else the CPU")
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
    if args.smoke:
        args.tiny = True
        if args.device is None:
            args.device = "cuda" if cuda_available() else "cpu"
            log("--smoke: PyTorch on %s" % args.device)
    if args.device is None:
        args.device = "cuda"
    if args.tf32:
        if args.precision and args.precision.strip() not in ("tf32",):
            ap.error("--tf32 is --precision tf32; give one of them")
        args.precision = "tf32"
    if args.precision is None:
        if args.device == "cuda":
            args.precision = "fp32,tf32,bf16"
        else:
            args.precision = "fp32,bf16" if args.smoke else "fp32"
    args.precisions = parse_list(args.precision, PRECISIONS, "precision", ap,
                                 {"float32": "fp32", "bfloat16": "bf16"})
    if not args.precisions:
        ap.error("--precision names none")
    if args.no_torch or args.torch_variants.strip() == "none":
        args.torch_variants = []
    else:
        args.torch_variants = parse_list(args.torch_variants, TORCH_VARIANTS, "PyTorch variant",
                                         ap, {"best-layout": "best", "compiled": "compile"})
    if args.warmup is None:
        args.warmup = 1 if args.smoke else 2 if args.tiny else 10
    if args.steps is None:
        args.steps = 1 if args.smoke else 3 if args.tiny else 30
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")
    if args.compile_warmup is None:
        args.compile_warmup = args.warmup if args.smoke else max(args.warmup, 3)
    if args.compile_warmup < 1:
        ap.error("--compile-warmup must be >= 1 (the first step compiles)")
    if args.gpipe_devices is None:
        args.gpipe_devices = "cpu:0" if args.device == "cpu" else "cuda:0"
    if args.gpipe:
        args.gpipe = os.path.abspath(args.gpipe)
        if not os.access(args.gpipe, os.X_OK):
            ap.error("--gpipe %s is not an executable" % args.gpipe)
    if args.onnx_dir is None and args.reuse_onnx:
        ap.error("--reuse-onnx needs --onnx-dir")
    # --gpipe-args words go to gpipe-onnx itself: a NAME=VALUE there would be
    # taken as a file or a flag's value, not set in the environment (a
    # variant's leading ones are; the base run's come from this environment).
    try:
        base_words = shlex.split(args.gpipe_args)
    except ValueError as e:
        ap.error("--gpipe-args: %s" % e)
    settings = [w for w in base_words if is_setting(w)]
    if settings:
        ap.error("--gpipe-args takes gpipe-onnx flags only, not environment settings (%s): set them in "
                 "the environment for every run, or in a --gpipe-variant's leading words for one"
                 % " ".join(settings))
    args.variants = []
    for item in args.gpipe_variant:
        label, sep, extra = item.partition("=")
        if not sep or not label.strip() or not extra.strip():
            ap.error("--gpipe-variant wants LABEL=ARGS, e.g. 'fast-conv=--fast-conv' (got '%s')" % item)
        try:
            variant_settings(extra)
        except ValueError as e:
            ap.error("--gpipe-variant %s: %s" % (label.strip(), e))
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
                   "momentum": args.momentum, "tiny": args.tiny, "smoke": args.smoke,
                   "device": args.device, "precisions": args.precisions,
                   "gpipe_devices": args.gpipe_devices, "gpipe_args": args.gpipe_args,
                   "gpipe_variants": dict(args.variants),
                   "torch_variants": args.torch_variants, "best_layout": BEST_LAYOUT,
                   "compile_mode": args.compile_mode, "compile_warmup": args.compile_warmup,
                   "torch_sdpa": args.torch_sdpa, "torch_deterministic": args.torch_deterministic},
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
            for precision in args.precisions:
                row = {"model": name, "precision": precision, "batch": batch, "torch": {}}
                rows.append(row)
                if args.device == "cpu" and precision == "tf32":
                    skip = {"error": "skipped: tf32 needs a GPU"}
                    row["torch"] = dict((v, skip) for v in args.torch_variants)
                    row["gpipe"] = skip if args.gpipe else None
                    write_outputs(args, header, rows)
                    continue
                for v in args.torch_variants:
                    row["torch"][v] = torch_side(args, name, precision, batch, v)
                    write_outputs(args, header, rows)
                bv, bt = best_torch(row)
                row["torch_best"] = bv
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
                if ok(bt) and ok(row.get("gpipe")):
                    row["gpipe_over_best_torch"] = round(row["gpipe"]["samples_per_s"] / bt["samples_per_s"], 4)
                write_outputs(args, header, rows)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    write_outputs(args, header, rows)
    log("done in %.0f s" % (time.time() - t_all))
    # The table, also on stdout.
    print("")
    print("\n".join(table_lines(args, rows)), flush=True)
    print("")
    print("\n".join(legend_lines(args)), flush=True)


if __name__ == "__main__":
    main()
