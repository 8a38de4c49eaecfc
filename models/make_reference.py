"""PyTorch reference training runs that the C trainer must reproduce.

Run with the interpreter that has torch 1.13, onnx and numpy (see regenerate.sh):

    python3 make_reference.py [--out-dir DIR] [--only FIXTURE ...]

For every fixture below it builds the PyTorch module from fixture_models.py,
loads the initializers of the opset-17 .onnx file into it by name, sets every
Dropout to p = 0, and trains 20 steps of batch 8 in file order (no shuffling)
twice: with SGD and with AdamW.  It writes, under reference/<fixture>/:

    data.npy, labels.npy     the 160 training samples and their labels
    <run>.json               the run's configuration and per-step losses
    <run>_final.onnx         the fixture file with the trained parameters and
                             BatchNorm running statistics as initializers

and, as a measure of how closely another float32 implementation can be
expected to agree, the same run in float64 (its deviation is recorded in the
JSON, not used as the reference), and which trained elements follow rounding
noise rather than the data (noise_driven_elements).  Everything is deterministic: the outputs are
byte-identical from run to run.  See reference/README.md for the contract.
"""
import argparse
import io
import json
import os
import sys

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fixture_models as fm  # noqa: E402

BATCH = 8
STEPS = 20
N = BATCH * STEPS

# fixture -> (model name in fixture_models, loss)
FIXTURES = {
    "mlp_op17": ("mlp", "cross-entropy"),
    "digits_cnn_op17": ("digits_cnn", "cross-entropy"),
    "resnet_op17": ("resnet", "cross-entropy"),
    "unet_op17": ("unet", "mse"),
    "gpt_op17": ("gpt", "cross-entropy"),
    "gpt_op13": ("gpt", "cross-entropy"),
}

RUNS = {
    "sgd": {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": False,
            "dampening": 0.0, "weight_decay": 1e-4, "betas": None, "eps": None,
            "amsgrad": None},
    "adamw": {"optimizer": "adamw", "lr": 1e-3, "momentum": None, "nesterov": None,
              "dampening": None, "weight_decay": 0.01, "betas": [0.9, 0.999], "eps": 1e-8,
              "amsgrad": False},
}

# Regeneration fails when float32 and float64 losses differ by more than this
# (relative): the comparison tolerance for the C trainer is 1e-4.
LOSS_GUARD = 1e-5
# A float64 gradient never above this over the run is mathematically zero
# (the bias of a convolution followed by a normalization).
ZERO_GRAD = 1e-10

# Data seeds per model, so that gpt_op13 and gpt_op17 train on the same data.
# (unet's seed 4 put one pre-LeakyReLU value within 3e-8 of zero at step 0, which
# flips the slope between float32 and float64: the guard in main() catches that.)
DATA_SEEDS = {"mlp": 1, "digits_cnn": 2, "resnet": 3, "unet": 6, "gpt": 5}


# --------------------------------------------------------------------------
# Data: small learnable tasks, drawn with numpy's legacy RandomState (its
# streams are frozen across numpy versions).
# --------------------------------------------------------------------------
def make_data(model):
    rs = np.random.RandomState(DATA_SEEDS[model])
    if model == "mlp":
        # labels from a random linear teacher
        x = rs.standard_normal((N, 32)).astype(np.float32)
        w = rs.standard_normal((32, 10))
        y = np.argmax(x.astype(np.float64) @ w, axis=1).astype(np.int64)
    elif model == "digits_cnn":
        x = np.load(os.path.join(HERE, "digits_train_x.npy"))[:N].astype(np.float32)
        y = np.load(os.path.join(HERE, "digits_train_y.npy"))[:N].astype(np.int64)
    elif model == "resnet":
        # labels from a random linear teacher on 4x4-pooled pixels
        x = rs.standard_normal((N, 3, 16, 16)).astype(np.float32)
        pooled = x.astype(np.float64).reshape(N, 3, 4, 4, 4, 4).mean(axis=(3, 5)).reshape(N, -1)
        w = rs.standard_normal((pooled.shape[1], 10))
        y = np.argmax(pooled @ w, axis=1).astype(np.int64)
    elif model == "unet":
        # target: a smoothed channel mix of the input, per pixel
        x = rs.standard_normal((N, 3, 16, 16)).astype(np.float32)
        mix = np.tensordot(x.astype(np.float64), np.array([0.5, -0.3, 0.2]), axes=([1], [0]))
        pad = np.pad(mix, ((0, 0), (1, 1), (1, 1)), mode="edge")
        smooth = sum(pad[:, i:i + 16, j:j + 16] for i in range(3) for j in range(3)) / 9.0
        y = np.tanh(2.0 * smooth)[:, None, :, :].astype(np.float32)
    elif model == "gpt":
        # arithmetic sequences mod vocab with 10% noise tokens; labels are the
        # next token at every position
        v, t = fm.GPT_VOCAB, fm.GPT_BLOCK
        start = rs.randint(0, v, size=(N, 1))
        stride = rs.randint(1, 4, size=(N, 1))
        seq = (start + stride * np.arange(t + 1)[None, :]) % v
        noise = rs.random_sample((N, t + 1)) < 0.1
        seq = np.where(noise, rs.randint(0, v, size=(N, t + 1)), seq)
        x = np.ascontiguousarray(seq[:, :t]).astype(np.int64)
        y = np.ascontiguousarray(seq[:, 1:]).astype(np.int64)
    else:
        raise ValueError(model)
    return np.ascontiguousarray(x), np.ascontiguousarray(y)


# --------------------------------------------------------------------------
# Model: fixture_models module with the .onnx file's initial weights.
# --------------------------------------------------------------------------
def onnx_initializers(path):
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


def build_model(model, init, dtype):
    net = fm.build(model)
    state = net.state_dict()
    loaded = {}
    for key, ref in state.items():
        if key.endswith("num_batches_tracked"):
            # Not exported; only read when BatchNorm momentum is None (it is 0.1).
            loaded[key] = torch.zeros_like(ref)
            continue
        assert key in init, f"{model}: {key} has no initializer in the .onnx file"
        arr = init[key]
        assert tuple(arr.shape) == tuple(ref.shape), \
            f"{model}: {key} is {tuple(arr.shape)} in the .onnx file, {tuple(ref.shape)} in torch"
        assert arr.dtype == np.float32, f"{model}: {key} is {arr.dtype}"
        loaded[key] = torch.from_numpy(arr.copy())
    net.load_state_dict(loaded, strict=True)
    for m in net.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            assert m.momentum == 0.1 and m.track_running_stats
    net.to(dtype)
    net.train()
    return net


def trained_state(net, init):
    """Parameters and BatchNorm running statistics by initializer name."""
    out = {}
    for name, p in net.named_parameters():
        out[name] = p
    for mod_name, m in net.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            out[f"{mod_name}.running_mean"] = m.running_mean
            out[f"{mod_name}.running_var"] = m.running_var
    for name in out:
        assert name in init, f"{name} is not an initializer of the .onnx file"
    return {k: v.detach().cpu().numpy() for k, v in out.items()}


# --------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------
def _sig(v):
    """Three significant digits: deviations are estimates, not references."""
    return float(f"{v:.3g}")


def _json(record):
    """One top-level key per line, losses one per line, the rest compact."""
    lines = []
    for k, v in record.items():
        if k == "losses":
            body = "[\n" + ",\n".join(f"  {json.dumps(x)}" for x in v) + "\n ]"
        else:
            body = json.dumps(v)
        lines.append(f" {json.dumps(k)}: {body}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _without(a, idx):
    """a (flattened) without the elements at idx; [0] when nothing is left."""
    a = a.ravel()
    if idx:
        a = np.delete(a, idx)
    return a if a.size else np.zeros(1)


def make_optimizer(run, params):
    if run["optimizer"] == "sgd":
        return torch.optim.SGD(params, lr=run["lr"], momentum=run["momentum"],
                               dampening=run["dampening"], nesterov=run["nesterov"],
                               weight_decay=run["weight_decay"])
    return torch.optim.AdamW(params, lr=run["lr"], betas=tuple(run["betas"]), eps=run["eps"],
                             weight_decay=run["weight_decay"], amsgrad=run["amsgrad"])


def loss_fn(kind, out, y):
    if kind == "mse":
        return F.mse_loss(out, y)
    if out.dim() == 3:  # gpt: [N, T, V] against [N, T]
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    return F.cross_entropy(out, y)


def train(model, init, run, loss_kind, x, y, dtype):
    net = build_model(model, init, dtype)
    opt = make_optimizer(run, net.parameters())
    xt = torch.from_numpy(x)
    yt = torch.from_numpy(y)
    if xt.is_floating_point():
        xt = xt.to(dtype)
    if yt.is_floating_point():
        yt = yt.to(dtype)
    losses = []
    max_grad = {name: torch.zeros_like(p) for name, p in net.named_parameters()}
    for s in range(STEPS):
        xb, yb = xt[s * BATCH:(s + 1) * BATCH], yt[s * BATCH:(s + 1) * BATCH]
        loss = loss_fn(loss_kind, net(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for name, p in net.named_parameters():
            max_grad[name] = torch.maximum(max_grad[name], p.grad.abs())
        opt.step()
        losses.append(float(loss.item()))
    return losses, trained_state(net, init), {k: v.numpy() for k, v in max_grad.items()}


def noise_driven(model, init, max_grad32, max_grad64):
    """Elements whose trained value follows rounding noise, by name -> flat
    indices: parameter elements whose gradient is mathematically zero but not
    in float32 (largest float64 gradient over the run below ZERO_GRAD, float32
    gradient not exactly 0: the bias of a convolution followed by a
    normalization, the key bias of attention; exact zeros such as a dead ReLU's
    weights are not noise), and the BatchNorm running statistics that such an
    element feeds (found by perturbing the elements and running one
    training-mode forward in float64)."""
    zero = {k: np.flatnonzero((g < ZERO_GRAD) & (max_grad32[k] > 0))
            for k, g in max_grad64.items()}
    zero = {k: v for k, v in zero.items() if v.size}
    out = {k: v.tolist() for k, v in zero.items()}
    if not zero:
        return out
    x, _ = make_data(model)
    xb = torch.from_numpy(x[:BATCH])
    if xb.is_floating_point():
        xb = xb.double()
    stats = []
    for perturb in (False, True):
        net = build_model(model, init, torch.float64)
        if perturb:
            params = dict(net.named_parameters())
            with torch.no_grad():
                for k, idx in zero.items():
                    params[k].view(-1)[torch.from_numpy(idx)] += 0.5
        with torch.no_grad():
            net(xb)
        stats.append(trained_state(net, init))
    for k in stats[0]:
        if k in max_grad64:
            continue
        idx = np.flatnonzero(np.abs(stats[0][k] - stats[1][k]) > 1e-9)
        if idx.size:
            out[k] = idx.tolist()
    return {k: out[k] for k in sorted(out)}


def final_onnx(src, state):
    """The bytes of `src` with the trained initializers, and their names."""
    m = onnx.load(src)
    replaced = set()
    for i, t in enumerate(m.graph.initializer):
        if t.name not in state:
            continue
        old = numpy_helper.to_array(t)
        new = state[t.name].astype(old.dtype)
        assert new.shape == old.shape, t.name
        m.graph.initializer[i].CopyFrom(numpy_helper.from_array(new, t.name))
        replaced.add(t.name)
    missing = set(state) - replaced
    assert not missing, f"{src}: no initializer for {sorted(missing)}"
    onnx.checker.check_model(m)
    return m.SerializeToString(), sorted(replaced)


def save_npy(x):
    buf = io.BytesIO()
    np.save(buf, x)
    return buf.getvalue()


def command_line(fixture, run_name, run, loss_kind):
    ref = f"models/reference/{fixture}"
    cmd = (f"gpipe-onnx train models/{fixture}.onnx --data {ref}/data.npy"
           f" --labels {ref}/labels.npy --batch {BATCH} --steps {STEPS} --no-shuffle --dropout 0"
           f" --optimizer {run['optimizer']} --lr {run['lr']:g}")
    if run_name == "sgd":
        cmd += f" --momentum {run['momentum']:g}"
    cmd += f" --weight-decay {run['weight_decay']:g} --loss {loss_kind}"
    return cmd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=os.path.join(HERE, "reference"))
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()

    torch.set_num_threads(1)              # fixed reduction order: byte-identical reruns
    torch.use_deterministic_algorithms(True)
    print(f"torch {torch.__version__}, onnx {onnx.__version__}, numpy {np.__version__}")

    summary = []
    for fixture in args.only or list(FIXTURES):
        model, loss_kind = FIXTURES[fixture]
        init = onnx_initializers(os.path.join(HERE, f"{model}_op17.onnx"))
        x, y = make_data(model)
        # Written once both runs have passed the guard: never half a fixture.
        files = {"data.npy": save_npy(x), "labels.npy": save_npy(y)}

        for run_name, run in RUNS.items():
            losses, state, grad32 = train(model, init, run, loss_kind, x, y, torch.float32)
            losses64, state64, grad64 = train(model, init, run, loss_kind, x, y, torch.float64)
            loss_dev = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses, losses64))
            if loss_dev > LOSS_GUARD:
                sys.exit(f"{fixture} {run_name}: float32 and float64 losses differ by"
                         f" {loss_dev:.2e}"
                         f" (relative; limit {LOSS_GUARD:g}): the run is ill-conditioned (a value"
                         " near a ReLU kink or a max-pool tie?); choose another data seed")
            noisy = noise_driven(model, init, grad32, grad64)
            noisy_abs = {k: _sig(float(np.max(np.abs(state[k].ravel()[idx].astype(np.float64)
                                                      - state64[k].ravel()[idx]))))
                         for k, idx in noisy.items()}
            w_dev = {k: float(np.max(_without(np.abs(state[k].astype(np.float64) - state64[k])
                                              / np.maximum(1.0, np.abs(state64[k])),
                                              noisy.get(k))))
                     for k in state}
            final = f"{run_name}_final.onnx"
            files[final], names = final_onnx(os.path.join(HERE, f"{fixture}.onnx"), state)
            record = {
                "fixture": f"{fixture}.onnx",
                "initial_weights": f"{model}_op17.onnx",
                "config": dict(run, batch=BATCH, steps=STEPS, shuffle=False, dropout=0.0,
                               loss=loss_kind, loss_reduction="mean",
                               batchnorm="training mode: batch statistics; running stats "
                                         "updated with momentum 0.1, unbiased variance"),
                "data": "data.npy",
                "labels": "labels.npy",
                "command": command_line(fixture, run_name, run, loss_kind),
                "losses": losses,
                "final_onnx": final,
                "trained_initializers": names,
                "noise_driven_elements": noisy,
                "float64_deviation": {
                    "max_loss_rel": _sig(loss_dev),
                    "weight_rel": {k: _sig(w_dev[k]) for k in sorted(w_dev)},
                    "noise_driven_abs": noisy_abs,
                },
                "generated_with": {"torch": torch.__version__, "numpy": np.__version__,
                                   "onnx": onnx.__version__},
            }
            files[f"{run_name}.json"] = _json(record).encode()
            worst = max(w_dev, key=w_dev.get)
            summary.append((fixture, run_name, losses[0], losses[-1], loss_dev, w_dev[worst],
                            worst))

        out_dir = os.path.join(args.out_dir, fixture)
        os.makedirs(out_dir, exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(out_dir, name), "wb") as f:
                f.write(data)

    print(f"\n{'fixture':16s} {'run':6s} {'loss step 0':>11s} {'loss step 19':>12s}"
          f" {'f64 loss dev':>12s} {'f64 weight dev':>14s} (worst initializer)")
    for fixture, run_name, first, last, ld, wd, worst in summary:
        print(f"{fixture:16s} {run_name:6s} {first:11.6f} {last:12.6f} {ld:12.1e} {wd:14.1e}"
              f" ({worst})")


if __name__ == "__main__":
    main()
