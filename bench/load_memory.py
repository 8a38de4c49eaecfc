"""Time and peak resident memory of loading a large model: `inspect`, and one
training step on the CPU backend, of a model of four float32 MatMul weights
(n x n each; n = 7800 makes a 973 MB file), written to a temporary folder.

    python3 bench/load_memory.py --gpipe build/src/gpipe-onnx [--n 7800] [--no-train]

Needs numpy and onnx. The peak is the child's ru_maxrss (os.wait4), the same
figure `/usr/bin/time -v` reports as "Maximum resident set size". The model
is made in a process of its own: Linux counts the resident memory a child
had when forked, and this one's would be the generator's.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time


def make_model(path, n):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits, nodes, prev = [], [], "x"
    for i in range(4):
        w = rng.standard_normal((n, n), dtype=np.float32) * 0.01
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"], name=f"mm{i}"))
        prev = f"h{i}"
    graph = helper.make_graph(
        nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", n])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["batch", n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="load_memory")
    onnx.save(model, path)


def measure(cmd):
    """(seconds, peak resident bytes, exit status) of one run of cmd."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    return time.monotonic() - start, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpipe", required=True, help="the gpipe-onnx binary")
    ap.add_argument("--n", type=int, default=7800, help="side of each of the four weights")
    ap.add_argument("--no-train", action="store_true", help="only inspect")
    ap.add_argument("--make", metavar="PATH", help=argparse.SUPPRESS)  # the generator's process
    args = ap.parse_args()
    if args.make:
        make_model(args.make, args.n)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "big.onnx")
        subprocess.run([sys.executable, __file__, "--gpipe", args.gpipe, "--n", str(args.n),
                        "--make", path], check=True)
        size = os.path.getsize(path)
        with open(path, "rb") as f:  # in the page cache, as after any first run
            while f.read(1 << 24):
                pass
        runs = [("inspect", [args.gpipe, "inspect", path])]
        if not args.no_train:
            runs.append(("train, 1 step", [args.gpipe, "train", path, "--synthetic", "4",
                                           "--batch", "2", "--steps", "1", "--quiet"]))
        print(f"model: {size / 1e6:.0f} MB (4 x {args.n}x{args.n} float32)")
        print("| run | seconds | peak resident | x file |")
        print("|---|---|---|---|")
        for name, cmd in runs:
            secs, peak, rc = measure(cmd)
            if rc != 0:
                sys.exit(f"{name} failed (exit status {rc}): {' '.join(cmd)}")
            print(f"| {name} | {secs:.2f} | {peak / 1e6:.0f} MB | {peak / size:.2f} |")


if __name__ == "__main__":
    main()
