#!/usr/bin/env python3
"""Pipeline throughput: gpipe-onnx on 1 and K GPUs against PyTorch's own GPipe
(torch.distributed.pipelining, ScheduleGPipe) on the same models and the same split.

    python3 bench/pipeline.py --gpipe build/src/gpipe-onnx \\
        [--models resnet50,unet,gpt2] [--m 1,4,8,32] [--gpus 2] [--share-gpu] [--mpi mpirun] \\
        [--precision fp32] \\
        [--warmup 3] [--steps 6] [--deadline SECONDS] [--trace-dir DIR] \\
        [--out pipeline.json] [--markdown pipeline.md]

    CPU smoke test (tiny models, gpipe-onnx's CPU devices cpu:0,cpu:1):
    /usr/bin/python3 bench/pipeline.py --device cpu --tiny --gpipe build-cpu/src/gpipe-onnx

For every model, the layer split over the K GPUs is computed once (`gpipe-onnx balance
--by time`, at --balance-chunks micro-batches, checkpoint never) and used for every M;
the PyTorch model (models.py, cut into units by stages.py) is split at the unit boundary
nearest to gpipe-onnx's in its layer list (units located by their parameters' names;
by parameter count when the names do not match). For every M (micro-batches
per mini-batch) that divides the batch: gpipe-onnx on one GPU and on K GPUs, each with
--checkpoint never and always, and PyTorch's pipeline (one process per GPU, NCCL). See
bench/README.md ("Pipelines").
"""
import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import socket
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import (LOSS, MODELS, NO_MULTICAST_ENV, PRECISIONS, error_line, export, fmt_rate,  # noqa: E402
                    gpipe_run, gpipe_version, last_line, log, md_cell, quote, run, run_stream,
                    set_log_prefix, summarize)

# Mini-batches of the pipeline runs: larger than bench.py's, so that micro-batches
# are not tiny at M = 32 (ResNet-50 16, U-Net 4, GPT-2 1 sample per micro-batch).
PIPE_BATCH = {"resnet50": 512, "unet": 128, "gpt2": 32}
PIPE_BATCH_TINY = {"resnet50": 16, "unet": 16, "gpt2": 16}
DEFAULT_M = "1,4,8,32"


def pipelining_missing():
    """None when torch.distributed.pipelining can be imported, else the reason."""
    import torch
    try:
        import torch.distributed.pipelining  # noqa: F401
        return None
    except Exception:  # ImportError, or a broken distributed build
        return "not available (torch %s has no torch.distributed.pipelining)" % torch.__version__


# ==========================================================================
# PyTorch side: `pipeline.py _torch ...` spawns one process per stage (rank), each
# prints nothing but rank 0, which prints "START m" and "RESULT {json}" per M.
# ==========================================================================
def _torch_args(argv):
    ap = argparse.ArgumentParser(prog="pipeline.py _torch")
    ap.add_argument("--model", required=True)
    ap.add_argument("--ms", required=True, help="micro-batch counts, comma-separated")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--cuts", required=True, help="unit indices where parts 1.. start")
    ap.add_argument("--precision", default="fp32", choices=PRECISIONS)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--warmup", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--momentum", type=float, required=True)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--pg-timeout", type=float, default=600)
    return ap.parse_args(argv)


def torch_launcher(argv):
    a = _torch_args(argv)
    ms = [int(m) for m in a.ms.split(",")]
    os.environ.update(NO_MULTICAST_ENV)
    missing = pipelining_missing()
    if missing:
        for m in ms:
            print("RESULT " + json.dumps({"m": m, "error": missing}), flush=True)
        return
    import torch
    import torch.multiprocessing as mp
    world = len(a.cuts.split(",")) + 1
    if a.device == "cuda" and torch.cuda.device_count() < world:
        raise SystemExit("needs %d GPUs, %d visible" % (world, torch.cuda.device_count()))
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    # A rank that raises exits non-zero; spawn then ends the others (no hang in a recv).
    mp.spawn(_torch_rank, args=(world, argv), nprocs=world, join=True)


def _torch_rank(rank, world, argv):
    a = _torch_args(argv)
    os.environ.update(NO_MULTICAST_ENV)
    import gc
    import inspect
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    import models as bm
    import stages

    cuda = a.device == "cuda"
    tf32 = a.precision == "tf32"
    # bf16 as bench.py's PyTorch side trains it: autocast over the step, float32 weights.
    amp = (torch.autocast("cuda", dtype=torch.bfloat16) if a.precision == "bf16"
           else contextlib.nullcontext())
    if cuda:
        dev = torch.device("cuda", rank)
        torch.cuda.set_device(dev)
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    else:
        dev = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=a.pg_timeout))
    if "input_args" in inspect.signature(PipelineStage.__init__).parameters and \
            inspect.signature(PipelineStage.__init__).parameters["input_args"].default is \
            inspect.Parameter.empty:
        raise SystemExit("torch %s's PipelineStage has no runtime shape inference (needs torch >= 2.6)"
                         % torch.__version__)
    step_kw = {}
    if "return_outputs" in inspect.signature(ScheduleGPipe.step).parameters:
        step_kw["return_outputs"] = False      # no merged logits on the last stage

    cuts = [int(c) for c in a.cuts.split(",")]
    model = bm.build(a.model, a.tiny)          # the same seed on every rank
    part = stages.split(a.model, model, cuts)[rank].to(dev).train()
    del model
    gc.collect()
    n_params = sum(p.numel() for p in part.parameters())
    sync = (lambda: torch.cuda.synchronize(dev)) if cuda else (lambda: None)

    def loss_fn(out, y):
        return bm.loss(a.model, out, y)

    warmup = max(1, a.warmup)       # the first step infers the stages' shapes
    fail_m = os.environ.get("PIPELINE_TEST_FAIL")     # "M:RANK", the harness's own test
    for m in [int(x) for x in a.ms.split(",")]:
        if rank == 0:
            print("START %d" % m, flush=True)
        try:
            if fail_m == "%d:%d" % (m, rank):
                raise RuntimeError("PIPELINE_TEST_FAIL at M=%d on rank %d" % (m, rank))
            x, y = bm.make_batch(a.model, a.batch, a.tiny)
            x = x.to(dev) if rank == 0 else None             # only the first stage reads it
            y = y.to(dev) if rank == world - 1 else None     # only the last the target
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(dev)
            stage = PipelineStage(part, rank, world, dev)
            sched = ScheduleGPipe(stage, n_microbatches=m, loss_fn=loss_fn)
            opt = torch.optim.SGD(part.parameters(), lr=a.lr, momentum=a.momentum)
            losses = []

            def step():
                del losses[:]
                with amp:
                    if rank == 0:
                        sched.step(x, **step_kw)
                    elif rank == world - 1:
                        sched.step(target=y, losses=losses, **step_kw)
                    else:
                        sched.step(**step_kw)
                opt.step()
                opt.zero_grad(set_to_none=True)

            t0 = time.perf_counter()
            for _ in range(warmup):
                step()
            sync()
            dist.barrier()
            warm_s = time.perf_counter() - t0
            times = []
            t_start = time.perf_counter()
            for _ in range(a.steps):
                t0 = time.perf_counter()
                step()
                sync()
                times.append(time.perf_counter() - t0)
            dist.barrier()
            wall = time.perf_counter() - t_start
            mine = {
                "rank": rank, "times": times, "parameters": n_params,
                "units": part.names[0] + ".." + part.names[-1],
                "max_memory_allocated": torch.cuda.max_memory_allocated(dev) if cuda else None,
                "max_memory_reserved": torch.cuda.max_memory_reserved(dev) if cuda else None,
                "device_name": torch.cuda.get_device_name(dev) if cuda else "cpu",
                "loss": (float(sum(float(l) for l in losses) / len(losses)) if losses else None),
            }
            ranks = [None] * world
            dist.all_gather_object(ranks, mine)
            if rank == 0:
                # A step's time: the slowest rank's, the step's end measured after a
                # device synchronization on each rank.
                per_step = [max(r["times"][i] for r in ranks) for i in range(a.steps)]
                res = summarize(a.batch, per_step) or {}
                loss = [r["loss"] for r in ranks if r["loss"] is not None]
                res.update({
                    "m": m, "micro_batch": a.batch // m,
                    "wall_samples_per_s": a.batch * a.steps / wall if wall > 0 else None,
                    "warmup_steps": warmup, "warmup_s": round(warm_s, 2),
                    "last_loss": loss[0] if loss else None,
                    "per_rank": [{"rank": r["rank"], "units": r["units"],
                                  "parameters": r["parameters"],
                                  "median_step_s": sorted(r["times"])[len(r["times"]) // 2],
                                  "max_memory_allocated": r["max_memory_allocated"],
                                  "max_memory_reserved": r["max_memory_reserved"],
                                  "device_name": r["device_name"]} for r in ranks],
                    "torch": torch.__version__,
                    "scale_grads": getattr(sched, "scale_grads", None),
                })
                if cuda:
                    res["allow_tf32"] = [torch.backends.cuda.matmul.allow_tf32,
                                         torch.backends.cudnn.allow_tf32]
                print("RESULT " + json.dumps(res), flush=True)
            sched = stage = opt = x = y = None
            part.zero_grad(set_to_none=True)
            gc.collect()
        except Exception as e:
            msg = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0] if str(e).strip() else "")
            print("ERROR %d rank %d %s" % (m, rank, msg), flush=True)
            sys.stdout.flush()
            os._exit(3)
    dist.barrier()
    dist.destroy_process_group()


# ==========================================================================
# The driver
# ==========================================================================
class Deadline(object):
    def __init__(self, seconds):
        self.t_end = time.time() + seconds if seconds else None

    def left(self):
        return None if self.t_end is None else self.t_end - time.time()

    def timeout(self, wanted):
        """A run's time limit: `wanted`, cut to what is left; None when nothing is."""
        left = self.left()
        if left is None:
            return wanted
        if left < 15:
            return None
        return min(wanted, left - 5)


SKIPPED = "skipped: --deadline reached"


def fmt_bytes(n):
    if n is None:
        return "-"
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return "%.1f %s" % (n / scale, unit)
    return "%d B" % n


_UNITS = {"B": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30, "TiB": 2 ** 40}
_STAGE_ROW = re.compile(r"^\s*(\d+)\s+(\d+)-(\d+)\s+(\S+)\s+" +
                        r"\s+".join([r"([\d.]+)\s+(B|KiB|MiB|GiB|TiB)"] * 5) + r"\s*$")


def parse_stage_memory(stderr):
    """gpipe-onnx train's stage memory report (stderr, without --quiet): a header
    'stage layers device parameters optimizer activations act. peak planned', then one
    row per stage. Returns [{stage, first_layer, last_layer, device, parameters,
    optimizer, activations, act_peak, planned}] in bytes (rounded as printed)."""
    rows, seen_header = [], False
    for line in (stderr or "").splitlines():
        if line.startswith("stage") and "planned" in line and "act. peak" in line:
            seen_header, rows = True, []
            continue
        if not seen_header:
            continue
        mt = _STAGE_ROW.match(line)
        if not mt:
            continue
        g = mt.groups()
        vals = [float(g[4 + 2 * i]) * _UNITS[g[5 + 2 * i]] for i in range(5)]
        rows.append({"stage": int(g[0]), "first_layer": int(g[1]), "last_layer": int(g[2]),
                     "device": g[3], "parameters": int(vals[0]), "optimizer": int(vals[1]),
                     "activations": int(vals[2]), "act_peak": int(vals[3]), "planned": int(vals[4])})
    return rows


def per_device(rows, key):
    """Sum of `key` over the stages of each device, in order of first appearance."""
    out = {}
    for r in rows:
        out[r["device"]] = out.get(r["device"], 0) + r[key]
    return out


class Bench(object):
    def __init__(self, args):
        self.args = args
        self.deadline = Deadline(args.deadline)
        self.rows = []
        self.splits = {}
        self.header = {}
        self.cpu = args.device == "cpu"
        kind = "cpu" if self.cpu else "cuda"
        self.dev1 = "%s:0" % kind
        # --share-gpu: the K stages on the first GPU (the pipeline's own cost: no speed-up
        # to gain, so the ideal is 1x).
        self.devk = ",".join("%s:%d" % (kind, 0 if args.share_gpu else i) for i in range(args.gpus))
        self.word = "dev" if self.cpu else "GPU"

    # ---- gpipe-onnx --------------------------------------------------------
    def gpipe_tool(self, what, cmd, timeout):
        """inspect / balance: (rc, stdout, stderr) or raises RuntimeError."""
        t = self.deadline.timeout(timeout)
        if t is None:
            raise RuntimeError(SKIPPED)
        rc, out, err, secs = run(cmd, t)
        if rc is None:
            raise RuntimeError("gpipe-onnx %s timed out after %.0f s" % (what, secs))
        if rc != 0:
            raise RuntimeError("gpipe-onnx %s failed: %s" % (what, error_line(err, "exit status %d" % rc)))
        return out, err, secs

    def inspect(self, onnx_path):
        out, _, secs = self.gpipe_tool("inspect", [self.args.gpipe, "inspect", onnx_path, "--json"],
                                       self.args.timeout)
        doc = json.loads(out)
        return [{"index": l["index"], "op": l["op"], "name": l.get("name", ""),
                 "params": int(l.get("params") or 0), "inputs": l.get("inputs") or []}
                for l in doc["layers"]], secs

    def balance(self, name, onnx_path, batch, ms, workdir):
        """The layers per stage for the K-GPU runs: --split, else `gpipe-onnx balance
        --by time` at --balance-chunks, else an even split. (list, description)"""
        a = self.args
        if name in a.split_map:
            return a.split_map[name], {"method": "--split"}
        chunks = a.balance_chunks if batch % a.balance_chunks == 0 else max(ms)
        path = os.path.join(workdir, "%s.balance.json" % name)
        cmd = [a.gpipe, "balance", onnx_path, "--devices", self.devk, "--by", "time",
               "--batch", str(batch), "--chunks", str(chunks), "--checkpoint", "never",
               "--optimizer", "sgd", "--momentum", repr(a.momentum), "--json", path]
        if a.precisions[0] != "fp32":  # timed as the first precision trains (one split for all)
            cmd += ["--precision", a.precisions[0]]
        if a.trace_dir:  # the per-layer profile too: where each model's time goes
            cmd += ["--profile-out", os.path.join(os.path.abspath(a.trace_dir), "%s_profile.json" % name)]
        log("%s: gpipe-onnx balance: %s" % (name, quote(cmd)))
        try:
            out, _, secs = self.gpipe_tool("balance", cmd, a.timeout)
            with open(path) as f:
                doc = json.load(f)
            bal = [int(v) for v in doc["balance"]]
            desc = {"method": "gpipe-onnx balance --by time", "chunks": chunks, "precision": a.precisions[0],
                    "checkpoint": "never", "command": cmd, "seconds": round(secs, 1),
                    "predicted_step_ms": doc.get("predicted_step_ms"),
                    "imbalance": doc.get("imbalance"),
                    "stage_time_ms": [s.get("time_ms") for s in doc.get("stages", [])],
                    "even": (doc.get("even") or {}).get("balance")}
            return bal, desc
        except (RuntimeError, OSError, ValueError, KeyError) as e:
            return None, {"method": "even", "balance_error": str(e)}

    def gpipe_train(self, name, onnx_path, batch, m, devices, checkpoint, balance, precision,
                    workdir, trace=None, processes=0, replicas=1):
        """One gpipe-onnx run: in one process, or (processes > 0) under --mpi as that many
        ranks, each a stage (--pipeline K) or, with replicas > 1, a replica of one stage
        training batch / replicas of the mini-batch (--pipeline 1)."""
        a = self.args
        k = len(devices.split(","))
        tag = "%s-%s-m%d-%s-%s%s" % (name, precision, m, "k%d" % k, checkpoint,
                                     "-np%d-d%d" % (processes, replicas) if processes else "")
        metrics = os.path.join(workdir, tag + ".metrics.jsonl")
        launcher = []
        if processes:
            launcher = [a.mpi, "-np", str(processes), "-x", "NCCL_NVLS_ENABLE", "-x", "TORCH_SYMM_MEM_DISABLE_MULTICAST"]
            if self.cpu:
                launcher.append("--oversubscribe")   # more ranks than cores on a small machine
            if hasattr(os, "geteuid") and os.geteuid() == 0:
                launcher.append("--allow-run-as-root")
        cmd = launcher + [a.gpipe, "train", onnx_path,
               "--synthetic", str(2 * batch), "--batch", str(batch),
               "--steps", str(a.warmup + a.steps), "--devices", devices, "--chunks", str(m),
               "--checkpoint", checkpoint,
               "--optimizer", "sgd", "--lr", repr(a.lr), "--momentum", repr(a.momentum),
               "--loss", LOSS[name], "--metrics", metrics]
        if balance and k > 1:
            cmd += ["--balance", ",".join(str(b) for b in balance)]
        if processes:
            cmd += ["--pipeline", str(processes // replicas)]
        if precision != "fp32":
            cmd += ["--precision", precision]
        if trace:
            cmd += ["--trace", trace]
        cmd += shlex.split(a.gpipe_args)
        where = ("%d stages on 1 %s" % (k, self.word) if k > 1 and a.share_gpu
                 else "%d %s%s" % (k, self.word, "s" if k > 1 else ""))
        label = "%s %s M=%d: gpipe-onnx %s, checkpoint %s%s" % (
            name, precision, m, where, checkpoint,
            "" if not processes else ", %d processes%s" % (
                processes, " (%d replicas)" % replicas if replicas > 1 else ""))
        t = self.deadline.timeout(a.timeout)
        if t is None:
            return {"error": SKIPPED}
        log("%s: %s" % (label, quote(cmd)))
        res, err = gpipe_run(cmd, metrics, t, a.warmup, batch)
        mem = parse_stage_memory(err)
        if mem:
            res["stages"] = mem
            res["planned_per_device"] = per_device(mem, "planned")
            res["act_peak_per_device"] = per_device(mem, "act_peak")
        if trace and not res.get("error"):
            res["trace"] = trace
        if res.get("error"):
            log("%s: %s" % (label, res["error"]))
        else:
            log("%s: %.1f samples/s (median step %.4f s, loss %.4f -> %.4f; planned %s)" % (
                label, res["samples_per_s"], res["median_step_s"], res["first_loss"],
                res["last_loss"], ", ".join(fmt_bytes(v) for v in res.get("planned_per_device", {}).values())))
        return res

    # ---- PyTorch -----------------------------------------------------------
    def torch_side(self, name, precision, batch, ms, cuts):
        """{m: result} for PyTorch's pipeline; one launch for all Ms, relaunched after
        the M it failed at."""
        a = self.args
        out = {}
        if a.no_torch:
            return {m: None for m in ms}
        if a.share_gpu:
            return {m: {"error": "not run: PyTorch's pipeline takes one %s a stage" % self.word} for m in ms}
        if cuts is None:
            return {m: {"error": "PyTorch: no split"} for m in ms}
        missing = pipelining_missing()
        if missing:
            log("%s %s: PyTorch pipelining %s" % (name, precision, missing))
            return {m: {"error": missing} for m in ms}
        pending = list(ms)
        while pending:
            t = self.deadline.timeout(a.timeout * len(pending))
            if t is None:
                for m in pending:
                    out[m] = {"error": SKIPPED}
                break
            cmd = [sys.executable, os.path.abspath(__file__), "_torch", "--model", name,
                   "--ms", ",".join(str(m) for m in pending), "--batch", str(batch),
                   "--cuts", ",".join(str(c) for c in cuts), "--precision", precision,
                   "--device", a.device, "--warmup", str(a.warmup), "--steps", str(a.steps),
                   "--lr", repr(a.lr), "--momentum", repr(a.momentum),
                   "--pg-timeout", repr(float(max(60, a.timeout)))]
            cmd += ["--tiny"] if a.tiny else []
            log("%s %s: PyTorch pipelining (ScheduleGPipe, %d processes) M=%s, %d+%d steps" % (
                name, precision, len(cuts) + 1, ",".join(str(m) for m in pending), a.warmup, a.steps))
            started, errors = [], {}

            def on_line(line):
                if line.startswith("RESULT "):
                    r = json.loads(line[len("RESULT "):])
                    out[r["m"]] = r
                    if not r.get("error"):
                        log("%s %s M=%d: PyTorch %.1f samples/s (median step %.4f s; max allocated %s)" % (
                            name, precision, r["m"], r["samples_per_s"], r["median_step_s"],
                            ", ".join(fmt_bytes(q["max_memory_allocated"]) for q in r["per_rank"])))
                elif line.startswith("START "):
                    started.append(int(line.split()[1]))
                    log("%s %s M=%d: PyTorch running" % (name, precision, started[-1]))
                elif line.startswith("ERROR "):
                    parts = line.split(" ", 4)
                    errors.setdefault(int(parts[1]), "rank %s: %s" % (
                        parts[3], parts[4] if len(parts) > 4 else ""))

            rc, sout, serr, secs = run_stream(cmd, t, on_line)
            pending = [m for m in pending if m not in out]
            if not pending:
                break
            if rc is None:
                why = "PyTorch timed out after %.0f s" % secs
            else:
                why = "PyTorch failed: " + (
                    errors.get(started[-1]) if started and started[-1] in errors else
                    last_line(_drop_tracebacks(serr), "exit status %s" % rc))
            failed = [m for m in pending if m in started] or pending[:1]
            if not started:
                failed = pending        # it failed before any M: all would
            for m in failed:
                out[m] = {"error": why, "stderr_tail": serr[-3000:]}
                log("%s %s M=%d: %s" % (name, precision, m, why))
            pending = [m for m in pending if m not in out]
        return out

    # ---- one model -----------------------------------------------------------
    def model(self, name, workdir):
        a = self.args
        batch = a.batch_map[name]
        ms = [m for m in a.ms if batch % m == 0]
        skipped_ms = [m for m in a.ms if batch % m != 0]
        split = {"batch": batch, "skipped_m": skipped_ms}
        self.splits[name] = split
        for m in skipped_ms:
            log("%s: M=%d skipped (does not divide the batch %d)" % (name, m, batch))
        rows = []
        for precision in a.precisions:
            for m in ms:
                row = {"model": name, "precision": precision, "batch": batch, "m": m,
                       "micro_batch": batch // m}
                rows.append(row)
                self.rows.append(row)

        def fail_all(msg):
            split["error"] = msg
            for row in rows:
                for key in ("gpipe_1_never", "gpipe_k_never", "gpipe_1_always", "gpipe_k_always") + (
                        ("gpipe_k_mpi", "gpipe_dp") if a.mpi else ()):
                    row.setdefault(key, {"error": msg})
                row.setdefault("torch", {"error": msg})
            self.write()

        onnx_path = os.path.join(workdir, "%s%s.onnx" % (name, "-tiny" if a.tiny else ""))
        layers = None
        if a.gpipe:
            t = self.deadline.timeout(a.timeout)
            if t is None:
                return fail_all(SKIPPED)
            info, err = export(a, name, onnx_path, timeout=t)
            if err:
                return fail_all(err)
            split["onnx"] = info
            try:
                layers, secs = self.inspect(onnx_path)
            except RuntimeError as e:
                return fail_all(str(e))
            split["layers"] = len(layers)
            bal, desc = self.balance(name, onnx_path, batch, ms, workdir)
            if bal is None:
                n, k = len(layers), a.gpus
                bal = [n // k + (1 if i < n % k else 0) for i in range(k)]
                log("%s: balance failed (%s); even split %s" % (name, desc["balance_error"], bal))
            split.update(desc)
            split["balance"] = bal
        elif name in a.split_map:
            split["balance"] = a.split_map[name]
        cuts = self.map_split(name, split, layers)
        self.write()

        # Order: the throughput runs (checkpoint never) of every M, then PyTorch, then
        # the checkpointed runs, so that a --deadline cuts the least important last.
        trace_m = max(ms) if ms else None
        bal = split.get("balance")
        for precision in a.precisions:
            prow = [r for r in rows if r["precision"] == precision]
            for row in prow:
                m = row["m"]
                if not a.gpipe:
                    for key in ("gpipe_1_never", "gpipe_k_never", "gpipe_1_always", "gpipe_k_always"):
                        row[key] = None
                    continue
                trace = None
                if a.trace_dir and name == "unet" and m == trace_m and precision == a.precisions[0]:
                    trace = os.path.join(os.path.abspath(a.trace_dir), "unet_trace.json")
                row["gpipe_k_never"] = self.gpipe_train(name, onnx_path, batch, m, self.devk, "never",
                                                        bal, precision, workdir, trace)
                self.write()
                row["gpipe_1_never"] = self.gpipe_train(name, onnx_path, batch, m, self.dev1, "never",
                                                        None, precision, workdir)
                self.write()
            if a.mpi:
                # The same pipeline as K processes, and K data-parallel replicas of the
                # whole model, each with the 1-device run's share (K x the batch).
                for row in prow:
                    m = row["m"]
                    row["gpipe_k_mpi"] = self.gpipe_train(name, onnx_path, batch, m, self.devk, "never",
                                                          bal, precision, workdir, processes=a.gpus)
                    self.write()
                    row["gpipe_dp"] = self.gpipe_train(name, onnx_path, a.gpus * batch, m, self.dev1, "never",
                                                       None, precision, workdir, processes=a.gpus,
                                                       replicas=a.gpus)
                    self.write()
            res = self.torch_side(name, precision, batch, [r["m"] for r in prow],
                                  [c["unit_index"] for c in cuts] if cuts else None)
            for row in prow:
                row["torch"] = res.get(row["m"])
            self.write()
            if not a.gpipe:
                continue
            for row in prow:
                m = row["m"]
                if "k" in a.ckpt_runs:
                    row["gpipe_k_always"] = self.gpipe_train(name, onnx_path, batch, m, self.devk,
                                                             "always", bal, precision, workdir)
                    self.write()
                if "1" in a.ckpt_runs:
                    row["gpipe_1_always"] = self.gpipe_train(name, onnx_path, batch, m, self.dev1,
                                                             "always", None, precision, workdir)
                    self.write()

    def map_split(self, name, split, layers):
        """PyTorch's cut points (unit indices, stages.py) for gpipe-onnx's split. Each
        unit's first layer in gpipe-onnx's layer list is the first layer that reads one
        of its parameters (ONNX initializers keep PyTorch's names); a stage boundary at
        layer L maps to the unit boundary whose first layer is nearest to L. Without the
        names (or without a layer list), by parameter count: the unit boundary whose
        parameters before it are nearest to those of gpipe-onnx's layers before L."""
        a = self.args
        bal = split.get("balance")
        if not bal or len(bal) < 2:
            return None
        try:
            import models as bm
            import stages
            model = bm.build(name, a.tiny)
            counts = stages.unit_params(name, model)
            pnames = stages.unit_param_names(name, model, "net." if name == "unet" else "")
            del model
        except Exception as e:
            split["torch_split_error"] = "%s: %s" % (type(e).__name__, e)
            return None
        n = len(counts)
        cum = [0]
        for _, c in counts:
            cum.append(cum[-1] + c)
        starts, s = [], 0
        for b in bal[:-1]:
            s += b
            starts.append(s)
        if layers:
            prefix = [sum(l["params"] for l in layers[:st]) for st in starts]
        else:   # no layer list (no --gpipe): an even split by parameters
            prefix = [cum[-1] * (i + 1) // len(bal) for i in range(len(bal) - 1)]
        first = None
        if layers:
            reader = {}
            for l in layers:
                for v in l.get("inputs") or []:
                    reader.setdefault(v, l["index"])
            first = []
            for _, ns in pnames:
                idx = [reader[v] for v in ns if v in reader]
                first.append(min(idx) if idx else None)
            if None in first or first != sorted(first):
                first = None
        if first is not None:
            chosen = stages.choose_cuts(first + [len(layers)], starts)
            method = "nearest unit start in gpipe-onnx's layer list (by parameter names)"
        else:
            chosen = stages.choose_cuts(cum, prefix)
            method = "nearest parameter count"
        cuts = []
        for st, p, j in zip(starts, prefix, chosen):
            c = {"gpipe_first_layer": st, "gpipe_params_before": p,
                 "unit_index": j, "unit": counts[j][0], "unit_before": counts[j - 1][0],
                 "torch_params_before": cum[j]}
            if first is not None:
                c["unit_first_layer"] = first[j]
            if layers and st < len(layers):
                c["gpipe_layer"] = "%s %s" % (layers[st]["op"], layers[st]["name"])
            cuts.append(c)
        split["torch_cuts"] = cuts
        split["torch_split_method"] = method
        split["torch_units"] = n
        split["parameters"] = cum[-1]
        desc = "; ".join("stage %d starts at unit %s%s (%s parameters before it; gpipe-onnx: "
                         "layer %d, %s)" % (
                             i + 1, c["unit"],
                             ", layer %d" % c["unit_first_layer"] if "unit_first_layer" in c else "",
                             "{:,}".format(c["torch_params_before"]), c["gpipe_first_layer"],
                             "{:,}".format(c["gpipe_params_before"]))
                         for i, c in enumerate(cuts))
        log("%s: gpipe-onnx --balance %s; PyTorch split by %s: %s" % (
            name, ",".join(str(b) for b in bal), method, desc))
        return cuts

    # ---- output --------------------------------------------------------------
    def write(self):
        a = self.args
        doc = dict(self.header)
        doc["splits"] = self.splits
        doc["results"] = self.rows
        if a.out:
            with open(a.out + ".tmp", "w") as f:
                json.dump(doc, f, indent=1)
            os.replace(a.out + ".tmp", a.out)
        if a.markdown:
            with open(a.markdown + ".tmp", "w") as f:
                f.write("\n".join(self.markdown()) + "\n")
            os.replace(a.markdown + ".tmp", a.markdown)

    def markdown(self):
        a, h = self.args, self.header
        K = a.gpus
        lines = [
            "## gpipe-onnx pipelines vs PyTorch pipelining (ScheduleGPipe), %d %ss" % (K, self.word)
            if not a.share_gpu else "## gpipe-onnx pipelines of %d stages sharing one %s" % (K, self.word),
            "",
            "- devices: %s" % h.get("device"),
            "- date: %s" % h.get("date"),
            "- torch %s; gpipe-onnx --version: %s" % (h.get("torch"), h.get("gpipe_version")),
            "- command: `%s`" % h.get("command"),
            "- method: SGD (lr %g, momentum %g), synthetic data; %d warm-up steps, then the median "
            "samples/s of %d timed steps (gpipe-onnx: its per-step metrics; PyTorch: "
            "synchronize + perf_counter per step, the slowest rank's). gpipe-onnx on %s (1) and "
            "%s (K) with the split below for every M; PyTorch one process per %s (%s), "
            "ScheduleGPipe, the same M, split at the nearest module boundary%s. Ideal speed-up "
            "%s; efficiency = speed-up / ideal; checkpoint overhead = step time with "
            "--checkpoint always / never - 1." % (
                a.lr, a.momentum, a.warmup, a.steps, self.dev1, self.devk, self.word,
                "gloo" if self.cpu else "NCCL",
                ", its stages under torch.autocast(bfloat16) in bf16" if "bf16" in a.precisions else "",
                "1x (--share-gpu: the K stages share one %s, so the speed-up measures what "
                "the pipeline costs)" % self.word if a.share_gpu else "K*M/(M+K-1)"),
        ]
        for name in a.models:
            sp = self.splits.get(name)
            if sp is None:
                continue
            for precision in a.precisions:
                rows = [r for r in self.rows if r["model"] == name and r["precision"] == precision]
                lines += ["", "### %s, %s, batch %d" % (name, precision, sp["batch"]), ""]
                lines += self.split_lines(name, sp)
                # --share-gpu: the K-stage run's column says its stages share one device.
                many = "%d stages on 1 %s" % (K, self.word) if a.share_gpu else "%d %ss" % (K, self.word)
                lines += [
                    "",
                    "| M | micro-batch | gpipe-onnx 1 %s samples/s | gpipe-onnx %s samples/s | "
                    "speed-up | ideal | efficiency | PyTorch pipelining samples/s | gpipe-onnx / PyTorch | "
                    "checkpoint overhead 1 %s | checkpoint overhead %s | "
                    "gpipe-onnx memory per %s (planned; act. peak) | PyTorch memory per %s (max allocated) |"
                    % (self.word, many, self.word, many, self.word, self.word),
                    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
                ]
                for r in rows:
                    lines.append(self.table_row(r))
                if a.mpi:
                    lines += [""] + self.mpi_lines(rows)
                for r in rows:
                    tr = (r.get("gpipe_k_never") or {}).get("trace")
                    if tr:
                        lines += ["", "Timeline of the last step of the %d-%s run at M = %d "
                                  "(`--trace`, recorded in every step of that run): `%s`" % (
                                      K, self.word, r["m"], tr)]
                if sp.get("skipped_m"):
                    lines.append("")
                    lines.append("M = %s skipped: does not divide the batch." %
                                 ", ".join(str(m) for m in sp["skipped_m"]))
        return lines

    def mpi_lines(self, rows):
        """The --mpi table: the K-stage pipeline as K processes against in one process, and
        K data-parallel replicas (each the 1-device run's batch) against one device."""
        K, w = self.args.gpus, self.word

        def ratio(x, y):
            ok = all(v is not None and not v.get("error") for v in (x, y))
            return "%.3fx" % (x["samples_per_s"] / y["samples_per_s"]) if ok else "-"

        def memory(x):
            # Rank 0's memory table: every stage of replica 0, each row from its own
            # process (planned per device; the activation peak that process measured).
            if x is None or x.get("error") or not x.get("stages"):
                return "-"
            return "%s (act. peak %s)" % (", ".join(fmt_bytes(v) for v in x["planned_per_device"].values()),
                                          ", ".join(fmt_bytes(v) for v in x["act_peak_per_device"].values()))

        out = ["| M | gpipe-onnx %d %ss, one process | %d processes (`mpirun -np %d ... --pipeline %d`) | "
               "processes / one process | %d replicas of the model (`--pipeline 1`, %d x the batch) | "
               "replicas / one %s (ideal %dx) | memory per %s, %d processes (planned) | "
               "memory per %s, %d replicas (planned) |" % (K, w, K, K, K, K, K, w, K, w, K, w, K),
               "|---:|---:|---:|---:|---:|---:|---|---|"]
        for r in rows:
            mp, dp = r.get("gpipe_k_mpi"), r.get("gpipe_dp")
            out.append("| %d | %s | %s | %s | %s | %s | %s | %s |" % (
                r["m"], fmt_rate(r.get("gpipe_k_never")), fmt_rate(mp), ratio(mp, r.get("gpipe_k_never")),
                fmt_rate(dp), ratio(dp, r.get("gpipe_1_never")), memory(mp), memory(dp)))
        return out

    def split_lines(self, name, sp):
        out = []
        bal = sp.get("balance")
        if bal:
            ranges, s = [], 0
            for b in bal:
                ranges.append("%d-%d" % (s, s + b - 1))
                s += b
            how = sp.get("method", "")
            if how.startswith("gpipe-onnx balance"):
                how += " at %d micro-batches, checkpoint never, %s" % (sp.get("chunks", 0),
                                                                       sp.get("precision", "fp32"))
                if sp.get("predicted_step_ms"):
                    how += "; predicted step %.1f ms" % sp["predicted_step_ms"]
            elif sp.get("balance_error"):
                how = "even split (balance failed: %s)" % sp["balance_error"]
            out.append("- gpipe-onnx split (%s): `--balance %s`, layers %s of %s" % (
                md_cell(how), ",".join(str(b) for b in bal), " \\| ".join(ranges), sp.get("layers", "?")))
        for i, c in enumerate(sp.get("torch_cuts") or []):
            out.append("- stage %d: gpipe-onnx from layer %d (%s, %s parameters before); PyTorch from "
                       "unit `%s`%s (after `%s`, %s parameters before; %s)" % (
                           i + 1, c["gpipe_first_layer"], md_cell(c.get("gpipe_layer", "?")),
                           "{:,}".format(c["gpipe_params_before"]), c["unit"],
                           " (its first layer: %d)" % c["unit_first_layer"] if "unit_first_layer" in c else "",
                           c["unit_before"], "{:,}".format(c["torch_params_before"]),
                           sp.get("torch_split_method", "")))
        if sp.get("error"):
            out.append("- %s" % md_cell(sp["error"]))
        if sp.get("torch_split_error"):
            out.append("- PyTorch split: %s" % md_cell(sp["torch_split_error"]))
        return out

    def table_row(self, r):
        K = self.args.gpus

        def ok(side):
            return side is not None and not side.get("error")

        g1, gk = r.get("gpipe_1_never"), r.get("gpipe_k_never")
        a1, ak = r.get("gpipe_1_always"), r.get("gpipe_k_always")
        t = r.get("torch")
        m = r["m"]
        ideal = 1.0 if self.args.share_gpu else K * m / float(m + K - 1)
        speed = eff = ratio = "-"
        if ok(g1) and ok(gk):
            sp = gk["samples_per_s"] / g1["samples_per_s"]
            speed, eff = "%.2fx" % sp, "%.0f%%" % (100 * sp / ideal)
        if ok(gk) and ok(t):
            ratio = "%.2fx" % (gk["samples_per_s"] / t["samples_per_s"])

        def overhead(never, always):
            if always is None:
                return "not run"
            if always.get("error"):
                return md_cell(always["error"])
            if not ok(never):
                return "-"
            return "%+.1f%%" % (100.0 * (never["samples_per_s"] / always["samples_per_s"] - 1))

        def gmem(side, label):
            if not ok(side) or not side.get("stages"):
                return None
            planned = side["planned_per_device"]
            peak = side["act_peak_per_device"]
            return "%s: %s (act. peak %s)" % (label, ", ".join(fmt_bytes(v) for v in planned.values()),
                                              ", ".join(fmt_bytes(v) for v in peak.values()))

        mem = [x for x in (gmem(gk, "never"), gmem(ak, "always"), gmem(g1, "1 %s" % self.word))
               if x]
        tmem = "-"
        if ok(t) and t.get("per_rank"):
            if t["per_rank"][0].get("max_memory_allocated") is None:
                tmem = "n/a on CPU"
            else:
                tmem = ", ".join(fmt_bytes(p["max_memory_allocated"]) for p in t["per_rank"])
        return "| %d | %d | %s | %s | %s | %.2fx | %s | %s | %s | %s | %s | %s | %s |" % (
            m, r["micro_batch"], fmt_rate(g1), fmt_rate(gk), speed, ideal, eff, fmt_rate(t), ratio,
            overhead(g1, a1), overhead(gk, ak), "<br>".join(mem) or "-", tmem)


def device_names(args):
    if args.device == "cpu":
        from common import device_name
        return "%s; gpipe-onnx CPU devices cpu:0..cpu:%d (worker threads)" % (
            device_name(args), args.gpus - 1)
    rc, out, err, _ = run([sys.executable, "-c",
                           "import torch\n"
                           "n = torch.cuda.device_count()\n"
                           "print('; '.join('cuda:%d %s' % (i, torch.cuda.get_device_name(i)) for i in range(n)))"],
                          120)
    return last_line(out) if rc == 0 else "unknown (%s)" % last_line(err)


def _drop_tracebacks(text):
    """The last meaningful line of a crashed spawn's stderr: skip warnings' noise."""
    lines = [l for l in (text or "").splitlines() if l.strip() and not l.startswith(" ")]
    return "\n".join(lines)


def parse_map(ap, text, flag, convert):
    out = {}
    for item in (text or "").split(";" if flag == "--split" else ","):
        if not item.strip():
            continue
        k, _, v = item.partition("=")
        k = k.strip()
        if k not in MODELS:
            ap.error("%s: unknown model in '%s'" % (flag, item))
        try:
            out[k] = convert(v)
        except ValueError:
            ap.error("%s: cannot read '%s'" % (flag, item))
    return out


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_torch":
        return torch_launcher(sys.argv[2:])
    set_log_prefix("pipeline")
    ap = argparse.ArgumentParser(
        description="Pipeline throughput: gpipe-onnx on 1 and K GPUs, and PyTorch's "
                    "torch.distributed.pipelining (ScheduleGPipe) on the same split.")
    ap.add_argument("--gpipe", default=None, help="the gpipe-onnx binary (without it: PyTorch only, even split)")
    ap.add_argument("--models", default="resnet50,unet,gpt2", help="comma-separated (default: all three)")
    ap.add_argument("--m", default=DEFAULT_M,
                    help="micro-batch counts M (default %s; an M that does not divide the batch is skipped)" % DEFAULT_M)
    ap.add_argument("--gpus", type=int, default=2, help="K, the pipeline's GPUs/stages (default 2)")
    ap.add_argument("--mpi", default=None, metavar="MPIRUN",
                    help="also run the K-stage pipeline as K processes and K data-parallel replicas "
                         "under this Open MPI mpirun (e.g. mpirun), beside the in-process runs")
    ap.add_argument("--share-gpu", action="store_true",
                    help="the K stages on the first GPU (a machine with one): the pipeline's own cost, ideal 1x; "
                         "no PyTorch side")
    ap.add_argument("--batch", default=None,
                    help="mini-batch per model, e.g. resnet50=256,gpt2=16 (default resnet50=512, unet=128, gpt2=32; 16 with --tiny)")
    ap.add_argument("--precision", default="fp32",
                    help="fp32, tf32, bf16 or a list such as fp32,tf32 (default fp32)")
    ap.add_argument("--tf32", action="store_true", help="the same as --precision tf32")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps per run (default 3; 1 with --tiny)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per run (default 6; 3 with --tiny)")
    ap.add_argument("--lr", type=float, default=0.01, help="SGD learning rate, both sides (0.01)")
    ap.add_argument("--momentum", type=float, default=0.9, help="SGD momentum, both sides (0.9)")
    ap.add_argument("--balance-chunks", type=int, default=8,
                    help="micro-batches at which gpipe-onnx balance profiles (default 8)")
    ap.add_argument("--split", default=None,
                    help="layers per stage instead of balancing, e.g. 'unet=150,88;resnet50=100,61'")
    ap.add_argument("--ckpt-runs", default="1,k",
                    help="which gpipe-onnx configurations also run with --checkpoint always: "
                         "'1,k' (default), 'k', '1' or 'none'")
    ap.add_argument("--gpipe-args", default="", help="extra gpipe-onnx train flags")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch side")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cuda (default), or cpu: gpipe-onnx on cpu:0..cpu:K-1, PyTorch with gloo")
    ap.add_argument("--tiny", action="store_true", help="tiny models (CPU smoke test)")
    ap.add_argument("--timeout", type=float, default=300,
                    help="seconds per export / gpipe-onnx run / PyTorch M (default 300)")
    ap.add_argument("--deadline", type=float, default=None,
                    help="stop starting runs after this many seconds; later cells read '%s'" % SKIPPED)
    ap.add_argument("--trace-dir", default=None,
                    help="write the U-Net's K-GPU run at the largest M's timeline to DIR/unet_trace.json "
                         "and each model's per-layer profile (from balancing) to DIR/<model>_profile.json")
    ap.add_argument("--onnx-dir", default=None, help="keep the exported models here (default: a temp dir)")
    ap.add_argument("--reuse-onnx", action="store_true", help="reuse models already in --onnx-dir")
    ap.add_argument("--out", default=None, help="results as JSON")
    ap.add_argument("--markdown", default=None, help="results as Markdown")
    args = ap.parse_args()

    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in args.models:
        if m not in MODELS:
            ap.error("unknown model '%s' (resnet50, gpt2, unet)" % m)
    args.precisions = ["tf32"] if args.tf32 else [p.strip() for p in args.precision.split(",") if p.strip()]
    for p in args.precisions:
        if p not in PRECISIONS:
            ap.error("unknown precision '%s' (fp32, tf32, bf16)" % p)
    if args.device == "cpu" and ("tf32" in args.precisions or "bf16" in args.precisions):
        ap.error("tf32 and bf16 need GPUs")
    try:
        args.ms = sorted(set(int(x) for x in args.m.split(",") if x.strip()))
    except ValueError:
        ap.error("--m wants numbers such as 1,4,8,32")
    if not args.ms or min(args.ms) < 1:
        ap.error("--m wants positive numbers")
    if args.gpus < 2:
        ap.error("--gpus must be at least 2")
    if args.mpi:
        found = shutil.which(args.mpi)
        if not found:
            ap.error("--mpi %s: no such launcher" % args.mpi)
        args.mpi = found
        if args.share_gpu:
            ap.error("--mpi runs a process a GPU: not with --share-gpu")
    if args.warmup is None:
        args.warmup = 1 if args.tiny else 3
    if args.steps is None:
        args.steps = 3 if args.tiny else 6
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")
    args.ckpt_runs = set(x.strip().lower() for x in args.ckpt_runs.split(",")) - {"none", ""}
    if not args.ckpt_runs <= {"1", "k"}:
        ap.error("--ckpt-runs wants 1, k, 1,k or none")
    args.batch_map = dict(PIPE_BATCH_TINY if args.tiny else PIPE_BATCH)
    for k, v in parse_map(ap, args.batch, "--batch", int).items():
        if v < 1:
            ap.error("--batch wants positive sizes")
        args.batch_map[k] = v
    args.split_map = parse_map(ap, args.split, "--split",
                               lambda v: [int(x) for x in v.split(",")])
    for k, v in args.split_map.items():
        if len(v) != args.gpus or min(v) < 1:
            ap.error("--split %s: %d positive layer counts needed" % (k, args.gpus))
    if args.gpipe:
        args.gpipe = os.path.abspath(args.gpipe)
        if not os.access(args.gpipe, os.X_OK):
            ap.error("--gpipe %s is not an executable" % args.gpipe)
    if args.onnx_dir is None and args.reuse_onnx:
        ap.error("--reuse-onnx needs --onnx-dir")
    if args.trace_dir:
        os.makedirs(args.trace_dir, exist_ok=True)

    os.environ.update(NO_MULTICAST_ENV)      # every process started from here inherits it
    bench = Bench(args)
    import torch
    bench.header = {
        "device": device_names(args),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "torch_pipelining": pipelining_missing() or "available",
        "python": platform.python_version(),
        "gpipe_version": gpipe_version(args.gpipe) if args.gpipe else "not run",
        "command": quote([sys.executable] + sys.argv),
        "config": {"gpus": args.gpus, "ms": args.ms, "batch": args.batch_map,
                   "precisions": args.precisions, "warmup": args.warmup, "steps": args.steps,
                   "lr": args.lr, "momentum": args.momentum, "balance_chunks": args.balance_chunks,
                   "ckpt_runs": sorted(args.ckpt_runs), "tiny": args.tiny, "device": args.device,
                   "gpipe_args": args.gpipe_args, "timeout": args.timeout,
                   "deadline": args.deadline, "env": NO_MULTICAST_ENV},
    }
    log("devices %s; torch %s (pipelining: %s); gpipe-onnx %s" % (
        bench.header["device"], bench.header["torch"], bench.header["torch_pipelining"],
        bench.header["gpipe_version"]))

    tmp = None
    workdir = args.onnx_dir
    if workdir:
        os.makedirs(workdir, exist_ok=True)
    else:
        tmp = workdir = tempfile.mkdtemp(prefix="gpipe-pipeline-")
    t_all = time.time()
    try:
        for name in args.models:
            try:
                bench.model(name, workdir)
            except Exception as e:       # a bug in one model's flow must not end the run
                import traceback
                traceback.print_exc()
                msg = "harness error: %s: %s" % (type(e).__name__, e)
                for r in bench.rows:
                    if r["model"] == name:
                        for key in ("gpipe_1_never", "gpipe_k_never", "gpipe_1_always",
                                    "gpipe_k_always", "torch"):
                            r.setdefault(key, {"error": msg})
                bench.splits.setdefault(name, {"batch": args.batch_map[name], "error": msg})
            bench.write()
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    bench.header["total_s"] = round(time.time() - t_all)
    bench.write()
    log("done in %.0f s" % (time.time() - t_all))
    print("")
    print("\n".join(bench.markdown()), flush=True)


if __name__ == "__main__":
    main()
