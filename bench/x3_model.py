#!/usr/bin/env python3
"""How far 3xTF32 sums land from the exact sum, by where their products meet.

A model of tensor-core accumulation (src/backend/cuda/conv_x3.h says why it
matters): an MMA instruction adds K_STEP exact products (TF32 x TF32 fits
float32) to its float32 accumulator and rounds the result either to nearest
("rn", what float32 arithmetic does) or toward zero ("rz"); "align" also
truncates every product to the accumulator's largest exponent first, as
Fasi, Higham, Mikaitis and Pranesh measured NVIDIA's tensor cores to do
("Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021). Each output is
a dot product of K terms; the script draws the test's data (test_cuda_conv's
3x3 64 -> 64 case: inputs in [-2, 2), gradients in [-1, 1)) and reports the
largest error against the exact sum over `--samples` outputs for:

  float32 in order     a sequential float32 sum (the CPU's kind of error)
  tripled, interleaved one TF32 call over 3K terms, the products of each
                       channel adjacent (gpipe-onnx's first 3xTF32, dropped)
  tripled, planar      the same call, copies in blocks of channels: per tap
                       (channels-last kernels take the taps outermost) and,
                       for kernels taking channels outermost, globally (tried)
  separate             hi hi in one call over K, then the two small products
                       over 2K added to it once (what GP_CONV_FP32=3xtf32 runs)

Usage: python3 bench/x3_model.py [--samples N] [--k-step 8] [--markdown]   (needs numpy)
"""
import argparse

import numpy as np

K_STEP = 8  # products per TF32 MMA instruction (m16n8k8; --k-step)


def f32(a):
    return a.astype(np.float32).astype(np.float64)


def round_toward_zero(a):
    r = f32(a)
    over = np.abs(r) > np.abs(a)
    r[over] = np.nextafter(r[over].astype(np.float32), np.float32(0)).astype(np.float64)
    return r


def tf32(a):
    """To nearest TF32 (10 mantissa bits), ties away from zero, as cvt.rna."""
    m, e = np.frexp(a)
    return np.ldexp(np.sign(m) * np.floor(np.abs(m) * 2**11 + 0.5) / 2**11, e)


def mma(acc, terms, model):
    """acc plus the rows of terms (exact products), as one instruction."""
    if model == "rn":
        return f32(acc + terms.sum(0))
    if model == "rz":
        return round_toward_zero(acc + terms.sum(0))
    every = np.vstack([acc[None], terms])
    top = np.max(np.abs(every), 0)
    top[top == 0] = 1
    unit = 2.0 ** (np.floor(np.log2(top)) - 23)
    return round_toward_zero((np.trunc(every / unit) * unit).sum(0))


def call(products, model):
    acc = np.zeros(products.shape[1])
    for k in range(0, products.shape[0], K_STEP):
        acc = mma(acc, products[k:k + K_STEP], model)
    return acc


def sequential(x, w):
    acc = np.zeros(x.shape[1])
    for k in range(x.shape[0]):
        acc = f32(acc + f32(x[k] * w[k]))
    return acc


def errors(taps, ch, x_range, w_range, samples, rng):
    n = taps * ch
    x = f32(rng.uniform(*x_range, (n, samples)))
    w = f32(rng.uniform(*w_range, (n, samples)))
    exact = (x * w).sum(0)
    xh, wh = tf32(x), tf32(w)
    xl, wl = tf32(f32(x - xh)), tf32(f32(w - wh))
    hh, lh, hl = xh * wh, xl * wh, xh * wl
    in_order = sequential(x, w)
    rows = {"float32 in order": {m: in_order for m in ("rn", "rz", "align")}}
    interleaved = np.stack([hh, lh, hl], 1).reshape(3 * n, samples)
    per_tap = np.vstack([np.vstack([lh[t * ch:(t + 1) * ch], hl[t * ch:(t + 1) * ch], hh[t * ch:(t + 1) * ch]])
                         for t in range(taps)])
    planar = np.vstack([lh, hl, hh])
    for name, products in (("tripled, interleaved", interleaved), ("tripled, planar per tap", per_tap),
                           ("tripled, planar (channels outermost)", planar)):
        rows[name] = {m: call(products, m) for m in ("rn", "rz", "align")}
    rows["separate (hi hi, then the small ones added)"] = {
        m: f32(call(hh, m) + call(np.vstack([lh, hl]), m)) for m in ("rn", "rz", "align")}
    return {name: {m: float(np.abs(v - exact).max()) for m, v in by.items()} for name, by in rows.items()}


def main():
    global K_STEP
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=4096, help="outputs per case (test_cuda_conv's: 25088, 36864)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--k-step", type=int, default=8, help="products an instruction adds (m16n8k4: 4)")
    ap.add_argument("--markdown", action="store_true", help="a table for bench/RESULTS.md")
    args = ap.parse_args()
    K_STEP = args.k_step
    rng = np.random.default_rng(args.seed)
    cases = (("Y, 3x3 64 -> 64 (576 terms)", 9, 64, (-2, 2), (-2, 2)),
             ("dW, 2 x 14 x 14 cells (392 terms)", 1, 392, (-2, 2), (-1, 1)))
    for label, taps, ch, xr, wr in cases:
        tol = 1e-6 + 4e-7 * taps * ch
        res = errors(taps, ch, xr, wr, args.samples, rng)
        if args.markdown:
            print(f"\n{label}, {args.samples} outputs; test_cuda_conv's float32 bound {tol:.3g} (plus 2e-5 relative)\n")
            print("| sum | round to nearest | truncate | align and truncate |")
            print("|---|---:|---:|---:|")
            for name, by in res.items():
                print(f"| {name} | {by['rn']:.3g} | {by['rz']:.3g} | {by['align']:.3g} |")
        else:
            print(f"{label}: largest error over {args.samples} outputs (float32 bound {tol:.3g})")
            for name, by in res.items():
                print(f"  {name:46s} rn {by['rn']:.3g}  rz {by['rz']:.3g}  align {by['align']:.3g}")


if __name__ == "__main__":
    main()
