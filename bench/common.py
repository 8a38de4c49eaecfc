"""Helpers shared by the benchmark drivers (bench.py, pipeline.py, profile.py): logging,
subprocesses with time limits and their results, exporting a model, running `gpipe-onnx
train` and reading its per-step metrics, the device's name. Imports no torch (the drivers import it when
they need it), runs under Python 3.7+.
"""
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# gpipe-onnx train --loss for each exported model (see export.py)
LOSS = {"resnet50": "cross-entropy", "gpt2": "cross-entropy", "unet": "output"}
MODELS = ("resnet50", "gpt2", "unet")
PRECISIONS = ("fp32", "tf32", "bf16")

# Never let NCCL or PyTorch's symmetric memory use NVLink multicast (NVLS): set in
# every process a driver starts.
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}

_LOG_PREFIX = ["bench"]


def set_log_prefix(prefix):
    _LOG_PREFIX[0] = prefix


def log(msg):
    print("[%s %s] %s" % (_LOG_PREFIX[0], time.strftime("%H:%M:%S"), msg), flush=True)


def last_line(text, default=""):
    lines = [l.strip() for l in (text or "").splitlines() if l.strip()]
    return lines[-1] if lines else default


def error_line(stderr, default=""):
    """The error message in a gpipe-onnx's stderr: its last line, skipping the
    "(see 'gpipe-onnx train --help')" hint that follows usage errors, without the
    "gpipe-onnx train: " prefix."""
    lines = [l.strip() for l in (stderr or "").splitlines() if l.strip()]
    lines = [l for l in lines if not (l.startswith("(see ") and l.endswith(")"))]
    if not lines:
        return default
    line = lines[-1]
    for prefix in ("gpipe-onnx train: ", "gpipe-onnx balance: ", "gpipe-onnx inspect: ",
                   "gpipe-onnx: ", "error: "):
        if line.startswith(prefix):
            line = line[len(prefix):]
    return line


def summarize(batch, times):
    """Median samples/s from per-step seconds, plus the mean over the window."""
    times = [t for t in times if t > 0]
    if not times:
        return None
    med = statistics.median(times)
    return {"samples_per_s": batch / med, "median_step_s": med,
            "mean_samples_per_s": batch * len(times) / sum(times),
            "min_step_s": min(times), "max_step_s": max(times), "timed_steps": len(times),
            "step_s": [round(t, 6) for t in times]}


def run(cmd, timeout, cwd=None, env=None):
    """(returncode or None on timeout, stdout, stderr, seconds)"""
    t0 = time.time()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=max(1.0, timeout), cwd=cwd, env=env)
        return p.returncode, p.stdout, p.stderr, time.time() - t0
    except subprocess.TimeoutExpired as e:
        def text(b):
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        return None, text(e.stdout), text(e.stderr), time.time() - t0


def worker_result(rc, out, err, secs):
    """The result of a worker subprocess (bench.py's and profile.py's PyTorch side) that
    prints its result as one line "RESULT {json}": the dict, with 'error' ("failed: ...")
    when it timed out, printed no result, reported an error or exited non-zero after its
    result, then with 'stderr_tail' too; and 'run_s'. `rc` None means timed out (run())."""
    if rc is None:
        return {"error": "failed: timed out after %.0f s" % secs, "run_s": round(secs, 1),
                "stderr_tail": (err or "")[-4000:]}
    res = None
    for line in (out or "").splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[len("RESULT "):])
    if res is None:
        res = {"error": "failed: " + last_line(err, "exit status %s" % rc)}
    elif res.get("error"):
        res["error"] = "failed: " + res["error"]
    elif rc != 0:
        res = {"error": "failed: exit status %s after its result" % rc}
    res["run_s"] = round(secs, 1)
    if res.get("error"):
        res["stderr_tail"] = (err or "")[-4000:]
    return res


def quote(cmd):
    return " ".join(shlex.quote(str(c)) for c in cmd)


def export(args, name, path, timeout=None):
    """Exports model `name` with export.py (in a subprocess) unless args.reuse_onnx and
    the file exists. Uses args.lr, args.tiny, args.timeout. (info dict, error or None)"""
    if args.reuse_onnx and os.path.exists(path):
        log("%s: reusing %s" % (name, path))
        return {"path": path, "reused": True}, None
    cmd = [sys.executable, os.path.join(HERE, "export.py"), name, path, "--json",
           "--lr", repr(args.lr)] + (["--tiny"] if args.tiny else [])
    log("%s: exporting to ONNX" % name)
    rc, out, err, secs = run(cmd, args.timeout if timeout is None else timeout)
    if rc is None:
        return None, "export failed: timed out after %.0f s" % secs
    if rc != 0:
        return None, "export failed: " + last_line(err, "exit status %d" % rc)
    info = json.loads(last_line(out))
    log("%s: exported in %.0f s (%d parameters, %.0f MB)" % (
        name, secs, info["parameters"], info.get("bytes", 0) / 1e6))
    return info, None


def gpipe_version(binary):
    rc, out, err, _ = run([binary, "--version"], 60)
    return last_line(out or err, "unknown")


def read_metrics(path, warmup, batch):
    """Reads a `gpipe-onnx train --metrics` file: (summary of the steps after `warmup`,
    all step records, error or None). The metrics give samples/s per step (batch / the
    step's wall time, host work included); the step's time is batch / samples_per_s.
    The summary also has 'planned_gib': the device memory the stages planned (parameters and
    their gradients, optimizer state, activations, kernel workspaces such as cuDNN's algorithms'
    in scratch; the metrics' memory records, summed over stages), without the CUDA context and
    what libraries allocate for themselves; and where cuDNN's
    algorithms were measured before the first step (no --algorithms file had them),
    'measure_s' and 'measured_problems'."""
    steps = []
    planned = 0
    measured = None
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    rec = json.loads(line)
                    if "samples_per_s" in rec:
                        steps.append(rec)
                    elif "memory" in rec:
                        planned += rec["memory"].get("planned_bytes", 0)
                    elif "measured" in rec:
                        measured = rec["measured"]
    except (OSError, ValueError) as e:
        return None, steps, "gpipe-onnx metrics unreadable: %s" % e
    timed = [r for r in steps if r["step"] > warmup]
    times = [batch / r["samples_per_s"] for r in timed if r["samples_per_s"] > 0]
    s = summarize(batch, times)
    if s is None:
        return None, steps, "gpipe-onnx: no timed steps in the metrics (%d steps recorded)" % len(steps)
    if planned:
        s["planned_gib"] = round(planned / 2**30, 2)
    if measured:
        s["measure_s"] = measured.get("seconds")
        s["measured_problems"] = measured.get("problems")
    return s, steps, None


def gpipe_run(cmd, metrics, timeout, warmup, batch, env=None):
    """Runs one `gpipe-onnx train` command line that writes --metrics `metrics`; returns
    (result dict, stderr). The result has 'command', 'run_s' and either 'error' (with
    'stderr_tail') or the summary of the timed steps plus 'first_loss', 'last_loss'."""
    if os.path.exists(metrics):
        os.remove(metrics)
    rc, out, err, secs = run(cmd, timeout, env=env)
    res = {"command": cmd, "run_s": round(secs, 1)}
    if rc is None:
        res["error"] = "gpipe-onnx timed out after %.0f s" % secs
        res["stderr_tail"] = err[-4000:]
        return res, err
    if rc != 0:
        res["error"] = "gpipe-onnx failed: " + error_line(err, "exit status %d" % rc)
        res["stderr_tail"] = err[-4000:]
        return res, err
    s, steps, error = read_metrics(metrics, warmup, batch)
    if error:
        res["error"] = error
        return res, err
    res.update(s)
    res["first_loss"] = steps[0]["loss"]
    res["last_loss"] = steps[-1]["loss"]
    return res, err


def device_name(args):
    if args.device == "cpu":
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        return "CPU: %s (%d cores)" % (line.split(":", 1)[1].strip(), os.cpu_count())
        except OSError:
            pass
        return "CPU: %s" % (platform.processor() or platform.machine())
    rc, out, err, _ = run([sys.executable, "-c",
                           "import torch; print(torch.cuda.get_device_name(0))"], 120)
    return last_line(out) if rc == 0 else "unknown (%s)" % last_line(err)


def fmt_rate(side):
    if side is None:
        return "not run"
    if side.get("error"):
        return md_cell(side["error"])
    return "%.1f" % side["samples_per_s"]


def md_cell(text):
    """Text made safe for a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def run_stream(cmd, timeout, on_line=None, env=None):
    """Like run(), for a command that starts processes of its own (torch.multiprocessing):
    it runs in a new session, its stdout lines are handed to on_line(line) as they come,
    and on timeout the whole process group is killed (no rank is left holding a GPU).
    (returncode or None on timeout, stdout, stderr, seconds)"""
    import signal
    import threading
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         universal_newlines=True, env=env, start_new_session=True)
    out, err = [], []

    def pump(stream, acc, cb):
        for line in stream:
            acc.append(line)
            if cb:
                try:
                    cb(line.rstrip("\n"))
                except Exception:
                    pass
        stream.close()

    threads = [threading.Thread(target=pump, args=(p.stdout, out, on_line)),
               threading.Thread(target=pump, args=(p.stderr, err, None))]
    for t in threads:
        t.daemon = True
        t.start()
    rc = None
    try:
        rc = p.wait(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)     # the launcher's children too
        except OSError:
            pass
        p.wait()
        for t in threads:
            t.join(10)
    return rc, "".join(out), "".join(err), time.time() - t0
