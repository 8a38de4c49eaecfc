#!/usr/bin/env python3
"""One training step of gpipe-onnx, kernel by kernel, under Nsight Compute, summed by class.

    python3 bench/ncu_step.py --gpipe build/src/gpipe-onnx --out step.csv -- \\
        train /tmp/onnx/resnet50.onnx --synthetic 256 --batch 128 --precision bf16 --loss cross-entropy
    python3 bench/ncu_step.py --csv step.csv            # the table again, from a saved run
    python3 bench/ncu_step.py --check                   # the parser and classes on a made-up table

The run trains 2 steps (`--steps 2 --cuda-graph off` are added) and ncu times every kernel
one at a time (`--clock-control none --cache-control none`: the GPU's own clocks, caches
as the step leaves them), with the DRAM bytes each moves. The table covers the LAST step:
the kernels after the previous step's optimizer launches. Each class gets its kernel time,
its bytes and the bandwidth they imply. Kernels run one at a time here, so the sum is the
step's kernel time without overlap, and the gaps are not in it (a --trace of the step has them).
"""
import argparse
import csv
import io
import re
import subprocess
import sys

# (class, pattern on the kernel's name), first match wins.
CLASSES = [
    ("cuDNN layout transposes (NCHW <-> NHWC)", r"ToNhwc|ToNchw|AddPadding|nchw2nhwc|nhwc2nchw"),
    ("our layout transposes (relayout: staged calls, filters, the stem's input)", r"relayout"),
    ("attention (own kernels, cuDNN's SDPA)", r"^(void )?att_|sdpa|fmha|flash|matmul_dq|compute_dot_do_o"),
    ("BatchNormalization", r"^(void )?bn_"),
    ("InstanceNormalization", r"^(void )?in_(forward|bwd)"),
    ("LayerNormalization", r"^(void )?ln_"),
    ("optimizer", r"optim_kernel|sgd|adamw"),
    ("gradient sums into buffers", r"accumulate|add_bf16_kernel"),
    ("Dropout", r"dropout"),
    ("pooling", r"pool|global_avg|global_max"),
    ("activations (unary)", r"unary_"),
    ("binary and broadcast (Add, Mul, ...)", r"same_forward|same_grad|row_forward|row_grad|bcast_|reduce_same|reduce_kernel|reduce_part|reduce_finish|binary"),
    ("loss", r"ce_rows|cross|mse|loss"),
    ("conversions", r"convert"),
    ("convolutions and GEMMs (cuDNN, cuBLAS)",
     r"cutlass|xmma|sm90|sm80|nvjet|cudnn|gemm|conv|implicit|wgrad|dgrad|fprop|splitK|SplitK"),
    ("resize, concat, copies", r"rs_|resize|concat|copy|view_kernel|view_tile|strided|transpose_kernel"),
]
_RULES = [(c, re.compile(p, re.I)) for c, p in CLASSES]


def classify(name):
    for c, r in _RULES:
        if r.search(name):
            return c
    return "other: " + name.split("(")[0][:48]


def num(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def rows_of(text):
    """ncu's --csv --page raw table: a header row with 'Kernel Name', a units row, the kernels."""
    rows = [r for r in csv.reader(io.StringIO(text)) if r]
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if head is None:
        raise ValueError("no 'Kernel Name' column: not ncu's --csv --page raw output")
    cols = rows[head]
    return [dict(zip(cols, r)) for r in rows[head + 2:] if len(r) == len(cols)]


def last_step(rows):
    """The kernels after the previous step's optimizer launches (all of them when there is one step)."""
    opt = [i for i, r in enumerate(rows) if re.search(r"optim_kernel", r["Kernel Name"])]
    if not opt:
        return rows
    # The last run of optimizer kernels ends the last step; the run before it ends the step before.
    runs, start = [], opt[0]
    for a, b in zip(opt, opt[1:] + [None]):
        if b is None or b != a + 1 and b > a + 8:
            runs.append((start, a))
            start = b
    return rows[runs[-2][1] + 1:] if len(runs) >= 2 else rows


def table(rows):
    by = {}
    for r in rows:
        c = classify(r["Kernel Name"])
        t = num(r.get("gpu__time_duration.sum", "0")) / 1e6  # ns -> ms
        b = num(r.get("dram__bytes.sum", "0"))
        n, tt, bb = by.get(c, (0, 0.0, 0.0))
        by[c] = (n + 1, tt + t, bb + b)
    lines = ["| class | kernels | ms | GB | TB/s |", "|---|---:|---:|---:|---:|"]
    total = 0.0
    for c, (n, t, b) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        total += t
        lines.append("| %s | %d | %.2f | %.1f | %.2f |" % (c, n, t, b / 1e9, b / 1e9 / t if t > 0 else 0))
    lines.append("| **sum** | %d | **%.2f** | | |" % (len(rows), total))
    return "\n".join(lines), by, total


def check():
    """A made-up two-step table: the parser, the step split and the classes."""
    head = '"ID","Kernel Name","gpu__time_duration.sum","dram__bytes.sum"\n"","","nsecond","byte"\n'
    step = [("bn_sums_kernel<io_typed<__nv_bfloat16>, 8>(bn_plan, gp_fptr, double*, double*)", "1,000", "2000000000"),
            ("void engines_precompiled::nchwToNhwcKernel<__nv_bfloat16>(x)", "500", "1000000000"),
            ("sm90_xmma_fprop_implicit_gemm_bf16", "2,000", "0"),
            ("void unary_backward_runs_kernel<__nv_bfloat16>(x)", "250", "500000000"),
            ("void optim_kernel<0>(mt_list, optim_scalars)", "100", "0"),
            ("void optim_kernel<0>(mt_list, optim_scalars)", "100", "0")]
    # A step has many more kernels between its optimizer launches than the gap (8) that splits runs.
    step = [("void view_kernel<grp<__nv_bfloat16, 8>>(x)", "0", "0")] * 9 + step
    text = head
    for k, (n, t, b) in enumerate(step * 2):
        text += '"%d","%s","%s","%s"\n' % (k, n, t, b)
    rows = last_step(rows_of(text))
    assert len(rows) == len(step), len(rows)
    md, by, total = table(rows)
    assert abs(total - 0.00395) < 1e-9, total
    assert by["BatchNormalization"][0] == 1 and abs(by["BatchNormalization"][1] - 0.001) < 1e-12
    assert "cuDNN layout transposes (NCHW <-> NHWC)" in by
    assert by["convolutions and GEMMs (cuDNN, cuBLAS)"][0] == 1
    assert by["optimizer"][0] == 2
    assert by["activations (unary)"][0] == 1
    assert by["resize, concat, copies"][0] == 9
    assert abs(by["BatchNormalization"][2] - 2e9) < 1
    try:
        rows_of("a,b\n1,2\n")
    except ValueError:
        pass
    else:
        raise AssertionError("a table without 'Kernel Name' was accepted")
    print(md)
    print("ncu_step: checks passed")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpipe", default="build/src/gpipe-onnx", help="the gpipe-onnx binary")
    ap.add_argument("--csv", help="summarize this saved ncu table instead of running")
    ap.add_argument("--out", help="also save ncu's table here")
    ap.add_argument("--check", action="store_true", help="check the parser on a made-up table")
    ap.add_argument("args", nargs="*", help="gpipe-onnx arguments after --, starting with 'train'")
    a = ap.parse_args()
    if a.check:
        check()
        return
    if a.csv:
        text = open(a.csv).read()
    else:
        if not a.args or a.args[0] != "train":
            ap.error("give the gpipe-onnx train arguments after --, or --csv FILE")
        cmd = ["ncu", "--csv", "--page", "raw", "--print-units", "base", "--clock-control", "none",
               "--cache-control", "none", "--metrics", "gpu__time_duration.sum,dram__bytes.sum",
               a.gpipe] + a.args + ["--steps", "2", "--cuda-graph", "off"]
        print("running:", " ".join(cmd), file=sys.stderr)
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit("ncu_step: ncu exited %d: %s" % (p.returncode, (p.stderr or p.stdout)[-2000:]))
        text = p.stdout
        if a.out:
            open(a.out, "w").write(text)
    md, _, _ = table(last_step(rows_of(text)))
    print(md)


if __name__ == "__main__":
    main()
