"""PyTorch bf16 autocast reference runs: the float32 runs of make_reference.py
repeated under torch.autocast(device_type='cpu', dtype=torch.bfloat16).

Run with the interpreter that has torch 1.13, onnx and numpy (see regenerate.sh),
after make_reference.py (it reads that script's outputs):

    python3 make_reference_bf16.py [--out-dir DIR] [--only FIXTURE ...]

For every fixture of make_reference.FIXTURES and both runs (sgd, adamw) it
builds the same module from the same initial weights, reads the committed
reference/<fixture>/data.npy and labels.npy, and trains the same 20 steps of
batch 8 with the same optimizer, the forward pass and the loss inside
torch.autocast, backward and optimizer step outside it, as PyTorch users do:
float32 master weights, gradients and optimizer state, autocast's casts to
bfloat16 and back.  It writes reference/<fixture>/<run>_bf16.json with the
per-step losses, their relative distance from the float32 run (<run>.json),
and which ops autocast ran in bfloat16 and which in float32.

Accumulation: matrix products and convolutions on bfloat16 operands are
computed in float32 and rounded to bfloat16 once (BF16Gemm below), as they are
on GPUs and on CPUs with bfloat16 support (oneDNN).  torch 1.13's own CPU
fallback kernels, used on CPUs without AVX-512, accumulate some of them in
bfloat16 (the convolutions, and the products of the backward pass); the
references would then depend on the machine and not follow autocast's float32
accumulation.  Everything else is PyTorch's own bfloat16 or float32 kernel.

The outputs are deterministic: running the script again gives byte-identical
files.  See reference/README.md ("bf16 autocast runs").
"""
import argparse
import json
import os
import sys

import numpy as np
import onnx
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_reference as mr  # noqa: E402

PRECISION = "bf16-autocast"
AUTOCAST = dict(device_type="cpu", dtype=torch.bfloat16)

_aten = torch.ops.aten
# Contractions whose bfloat16 form BF16Gemm computes with float32 accumulation.
GEMM_OPS = {_aten.mm, _aten.addmm, _aten.bmm, _aten.baddbmm, _aten.addbmm, _aten.mv,
            _aten.addmv, _aten.dot, _aten.convolution, _aten.convolution_backward}
# Exact data movement, left out of the op record.
VIEW_OPS = {"detach", "view", "_reshape_alias", "_unsafe_view", "t", "transpose", "permute",
            "expand", "split", "slice", "select", "clone", "unsqueeze", "squeeze", "empty",
            "_to_copy"}


def _is_bf16(t):
    return isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16


class BF16Gemm(TorchDispatchMode):
    """bfloat16 matrix products and convolutions (forward and backward) with
    float32 accumulation: the bfloat16 operands are widened to float32 (exactly),
    the float32 kernel runs, and each result is rounded to bfloat16 once.
    Sits below autocast and autograd, so it changes neither autocast's choice of
    dtypes nor the autograd graph."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket in GEMM_OPS and any(map(_is_bf16, tree_flatten((args, kwargs))[0])):
            floats = [t.dtype for t in tree_flatten((args, kwargs))[0]
                      if isinstance(t, torch.Tensor) and t.is_floating_point()]
            assert all(d == torch.bfloat16 for d in floats), f"{func}: mixed {floats}"
            up = lambda t: t.float() if _is_bf16(t) else t  # noqa: E731
            out = func(*tree_map(up, args), **tree_map(up, kwargs))
            return tree_map(lambda t: t.bfloat16() if isinstance(t, torch.Tensor)
                            and t.dtype == torch.float32 else t, out)
        return func(*args, **kwargs)


def _dtypes(tree):
    return [str(t.dtype).replace("torch.", "") for t in tree_flatten(tree)[0]
            if isinstance(t, torch.Tensor)]


class OpLog(TorchDispatchMode):
    """Records, for every aten op that reaches the kernels (after autocast's
    casts), the dtypes of its tensor inputs and outputs, and which parameters
    autocast cast to bfloat16."""

    def __init__(self, params):
        super().__init__()
        self.params = params            # data_ptr -> name
        self.ops = {}                   # op -> [signature, ...] in order of first use
        self.cast = []                  # parameters cast to bfloat16

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if name == "_to_copy" and out.dtype == torch.bfloat16:
            p = self.params.get(args[0].data_ptr())
            if p is not None and p not in self.cast:
                self.cast.append(p)
        ins, outs = tree_flatten((args, kwargs))[0], tree_flatten(out)[0]
        floating = any(isinstance(t, torch.Tensor) and t.is_floating_point() for t in ins + outs)
        if name not in VIEW_OPS and floating:
            sig = f"{','.join(_dtypes((args, kwargs)))} -> {','.join(_dtypes(out))}"
            sigs = self.ops.setdefault(f"aten.{name}", [])
            if sig not in sigs:
                sigs.append(sig)
        return out


def autocast_dtypes(model, init, loss_kind, x, y):
    """What autocast did in one training-mode forward and loss (the first
    batch): per leaf module class the input -> output dtype, per aten op the
    tensor dtypes it ran with, the parameters autocast cast to bfloat16 and
    those it used in float32, and the loss dtype."""
    net = mr.build_model(model, init, torch.float32)
    modules = {}

    def hook(mod, inputs, output):
        ins = [t for t in inputs if isinstance(t, torch.Tensor)]
        sig = f"{_dtypes(ins[0])[0] if ins else '-'} -> {','.join(_dtypes(output))}"
        sigs = modules.setdefault(type(mod).__name__, [])
        if sig not in sigs:
            sigs.append(sig)

    for m in net.modules():
        if not list(m.children()):
            m.register_forward_hook(hook)
    params = {p.data_ptr(): n for n, p in net.named_parameters()}
    log = OpLog(params)
    with log, torch.autocast(**AUTOCAST):
        loss = mr.loss_fn(loss_kind, net(x), y)
    cast = [n for n, _ in net.named_parameters() if n in log.cast]
    return {
        "modules": {k: v[0] if len(v) == 1 else v for k, v in modules.items()},
        "ops": {k: v[0] if len(v) == 1 else v for k, v in log.ops.items()},
        "bf16_weight_copies": cast,
        "float32_parameters": [n for n, _ in net.named_parameters() if n not in cast],
        "loss": str(loss.dtype).replace("torch.", ""),
    }


def train(model, init, run, loss_kind, x, y, bf16):
    """make_reference.train's loop; with bf16, forward and loss under autocast."""
    net = mr.build_model(model, init, torch.float32)
    opt = mr.make_optimizer(run, net.parameters())
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    losses = []
    for s in range(mr.STEPS):
        xb, yb = xt[s * mr.BATCH:(s + 1) * mr.BATCH], yt[s * mr.BATCH:(s + 1) * mr.BATCH]
        if bf16:
            with BF16Gemm():
                with torch.autocast(**AUTOCAST):
                    loss = mr.loss_fn(loss_kind, net(xb), yb)
                assert loss.dtype == torch.float32
                opt.zero_grad(set_to_none=True)
                loss.backward()
        else:
            loss = mr.loss_fn(loss_kind, net(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
        for p in net.parameters():
            assert p.dtype == torch.float32 and p.grad.dtype == torch.float32
        opt.step()
        losses.append(float(loss.item()))
    assert all(np.isfinite(losses)), losses
    return losses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=os.path.join(HERE, "reference"))
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()

    torch.set_num_threads(1)              # fixed reduction order: byte-identical reruns
    torch.use_deterministic_algorithms(True)
    print(f"torch {torch.__version__}, onnx {onnx.__version__}, numpy {np.__version__}")

    summary = []
    for fixture in args.only or list(mr.FIXTURES):
        model, loss_kind = mr.FIXTURES[fixture]
        ref_dir = os.path.join(HERE, "reference", fixture)
        init = mr.onnx_initializers(os.path.join(HERE, f"{model}_op17.onnx"))
        x = np.load(os.path.join(ref_dir, "data.npy"))
        y = np.load(os.path.join(ref_dir, "labels.npy"))
        dtypes = autocast_dtypes(model, init, loss_kind, torch.from_numpy(x[:mr.BATCH]),
                                 torch.from_numpy(y[:mr.BATCH]))
        files = {}
        for run_name, run in mr.RUNS.items():
            with open(os.path.join(ref_dir, f"{run_name}.json")) as f:
                ref = json.load(f)
            assert {k: ref["config"][k] for k in run} == run, f"{fixture} {run_name}: config"
            # The float32 run again, through this script's loop: it must give
            # the recorded losses bit for bit, or the two runs are not comparable.
            if train(model, init, run, loss_kind, x, y, bf16=False) != ref["losses"]:
                sys.exit(f"{fixture} {run_name}: the float32 run no longer reproduces"
                         f" {run_name}.json; run make_reference.py first")
            losses = train(model, init, run, loss_kind, x, y, bf16=True)
            rel = [abs(a - b) / abs(b) for a, b in zip(losses, ref["losses"])]
            record = {
                "fixture": ref["fixture"],
                "initial_weights": ref["initial_weights"],
                "precision": PRECISION,
                "autocast": {
                    "device_type": AUTOCAST["device_type"], "dtype": "bfloat16",
                    "scope": "forward and loss inside autocast; backward and optimizer step"
                             " outside",
                    "master_weights": "float32", "gradients": "float32",
                    "optimizer_state": "float32",
                    "gemm_accumulation": "float32: bfloat16 matrix products and convolutions"
                                         " (forward and backward) computed in float32, each"
                                         " result rounded to bfloat16 once",
                },
                "config": ref["config"],
                "data": ref["data"],
                "labels": ref["labels"],
                "command": ref["command"] + " --precision bf16",
                "losses": losses,
                "float32_run": f"{run_name}.json",
                "float32_distance": {"loss_rel": [mr._sig(r) for r in rel],
                                     "max_loss_rel": mr._sig(max(rel))},
                "autocast_dtypes": dtypes,
                "generated_with": {"torch": torch.__version__, "numpy": np.__version__,
                                   "onnx": onnx.__version__},
            }
            files[f"{run_name}_bf16.json"] = mr._json(record).encode()
            summary.append((fixture, run_name, losses[0], losses[-1], rel[0], max(rel),
                            int(np.argmax(rel))))

        out_dir = os.path.join(args.out_dir, fixture)
        os.makedirs(out_dir, exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(out_dir, name), "wb") as f:
                f.write(data)

    print(f"\n{'fixture':16s} {'run':6s} {'loss step 0':>11s} {'loss step 19':>12s}"
          f" {'step-0 rel':>10s} {'max rel vs float32':>18s} (step)")
    for fixture, run_name, first, last, r0, rmax, at in summary:
        print(f"{fixture:16s} {run_name:6s} {first:11.6f} {last:12.6f} {r0:10.1e}"
              f" {rmax:18.1e} ({at})")


if __name__ == "__main__":
    main()
