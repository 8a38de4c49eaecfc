"""Prints the PyTorch reference values pasted into tests/test_loss.c and
tests/test_optim.c. Run with torch 1.13 (CPU, AVX2): python3 torch_reference.py
Run with torch 2.x for the want_t2_* moments (section "torch2")."""
import math
import re
import sys

import numpy as np
import torch
import torch.nn.functional as F


def hx(v):
    v = float(v)
    if v == 0:
        return "0.0f" if math.copysign(1, v) > 0 else "-0.0f"
    m = re.match(r"(-?0x[01])\.?([0-9a-f]*?)0*p([+-]\d+)", v.hex())
    return m.group(1) + ("." + m.group(2) if m.group(2) else "") + "p" + m.group(3) + "f"


def arr(name, t, per=6):
    vals = [hx(v) for v in np.asarray(t, dtype=np.float32).ravel()]
    lines = [", ".join(vals[i:i + per]) for i in range(0, len(vals), per)]
    return f"static const float {name}[{len(vals)}] = {{\n    " + ",\n    ".join(lines) + "};"


def loss_refs():
    torch.manual_seed(3)
    r = lambda *s: torch.round(torch.randn(*s) * 2 * 1000) / 1000
    lit = lambda t: ", ".join("%.9gf" % v for v in t.detach().numpy().ravel())
    for name, shape, y, view in [
        ("ce [4,5]", (4, 5), torch.tensor([1, 4, -100, 0]), None),
        ("ce [2,3,4] (language model)", (2, 3, 4), torch.tensor([[3, 0, -100], [1, 1, 2]]), 4),
        ("ce [2,3,2,2]", (2, 3, 2, 2), torch.tensor([[[0, 2], [1, -100]], [[2, 2], [0, 1]]]), None),
    ]:
        x = r(*shape).requires_grad_()
        xs, ys = (x.reshape(-1, view), y.reshape(-1)) if view else (x, y)
        s = F.cross_entropy(xs.double(), ys, reduction="sum").item()
        F.cross_entropy(xs, ys).backward()
        print(f"/* {name} */\nx: {lit(x)}\nloss_sum: {s!r}\n{arr('grad', x.grad)}")
    p = r(2, 3).requires_grad_()
    t = r(2, 3)
    s = F.mse_loss(p.double(), t.double(), reduction="sum").item()
    F.mse_loss(p, t).backward()
    print(f"/* mse */\np: {lit(p)}\nt: {lit(t)}\nloss_sum: {s!r}\n{arr('grad', p.grad)}")


def inputs11():
    torch.manual_seed(42)
    np.random.seed(42)
    p0 = (torch.randn(11) * 0.5).float()
    p0[3] = 0.0
    grads = [(torch.randn(11) * [0.1, 1.0, 3.0][s]).float() for s in range(3)]
    grads[1][5] = 0.0
    grads[2][0] = -grads[2][0] * 50
    return p0, grads


def run3(kind, kw, p0, grads):
    p = torch.nn.Parameter(p0.clone())
    opt = (torch.optim.SGD if kind == "sgd" else torch.optim.AdamW)([p], foreach=False, **kw)
    for s, lr in enumerate([kw["lr"], kw["lr"], kw["lr"] * 0.5]):
        for g in opt.param_groups:
            g["lr"] = lr
        p.grad = grads[s].clone()
        opt.step()
    return p.detach(), opt.state[p]


def optim_refs():
    p0, grads = inputs11()
    print(arr("p0", p0))
    print(arr("grads", torch.stack(grads)))
    for name, kind, kw in [
        ("sgd_plain", "sgd", dict(lr=0.1)),
        ("sgd_momentum", "sgd", dict(lr=0.05, momentum=0.9)),
        ("sgd_nesterov_wd", "sgd", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)),
        ("sgd_dampening_wd", "sgd", dict(lr=0.01, momentum=0.8, dampening=0.3, weight_decay=5e-4)),
        ("adamw_default", "adamw", dict(lr=1e-3)),
        ("adamw_custom", "adamw", dict(lr=3e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)),
    ]:
        p, st = run3(kind, kw, p0, grads)
        print(f"/* {kind} {kw} */")
        print(arr("want_" + name, p))
        if kind == "adamw":
            print(arr("want_" + name + "_m", st["exp_avg"]))
            print(arr("want_" + name + "_v", st["exp_avg_sq"]))
        elif "momentum" in kw:
            print(arr("want_" + name + "_buf", st["momentum_buffer"]))
    x = (torch.randn(40) * 2).float()
    print(arr("norm_x", x))
    print(arr("norm_want", [torch.norm(x[:k], 2.0).item() for k in range(1, 41)]))
    sizes = [13, 4, 20, 1, 9]
    gs = [(torch.randn(k) * 3).float() for k in sizes]
    print(arr("clip_g", torch.cat(gs)))
    for maxn in [1.0, 1e3]:
        ps = [torch.nn.Parameter(torch.zeros(k)) for k in sizes]
        for q, g in zip(ps, gs):
            q.grad = g.clone()
        tn = torch.nn.utils.clip_grad_norm_(ps, maxn)
        print(f"/* max_norm {maxn}: total norm {hx(tn.item())} */")
        print(arr(f"clip_want_{int(maxn)}", torch.cat([q.grad for q in ps])))
    p = torch.nn.Parameter(torch.zeros(1))
    o = torch.optim.SGD([p], lr=0.1)
    sch = torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.1)
    lrs = []
    for _ in range(12):
        lrs.append(o.param_groups[0]["lr"])
        o.step()
        sch.step()
    print("step_lrs:", ", ".join(float(v).hex() for v in lrs))

    def cosine(k, base=0.1, warm=4, total=20, mn=1e-3):
        if k < warm:
            return base * float(k + 1) / float(warm)
        if k >= total:
            return mn
        return mn + (base - mn) * 0.5 * (1.0 + math.cos(math.pi * float(k - warm) / float(total - warm)))

    print("cos_lrs:", ", ".join(cosine(k).hex() for k in range(23)))


def torch2_refs():
    p0, grads = inputs11()
    for name, kw in [("t2_b09", dict(lr=1e-3)),
                     ("t2_b03", dict(lr=5e-3, betas=(0.3, 0.99), weight_decay=0.05))]:
        _, st = run3("adamw", kw, p0, grads)
        print(f"/* torch {torch.__version__} AdamW {kw} */")
        print(arr("want_" + name + "_m", st["exp_avg"]))
        print(arr("want_" + name + "_v", st["exp_avg_sq"]))


# ---- bulk checks (FNV-1a hashes over float32 bytes) ----

def fnv(data, h=0xcbf29ce484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


class Lcg:
    def __init__(self, seed):
        self.s = seed

    def vals(self, n, scale):
        out = np.empty(n, np.float32)
        for i in range(n):
            self.s = (self.s * 1664525 + 1013904223) & 0xFFFFFFFF
            v = (((self.s >> 8) % 20001) - 10000) / 4096.0
            out[i] = np.float32(v * scale) if i % 17 else np.float32(0.0)
        return out


def bulk_refs():
    scales = [2.0 ** -4, 1.0, 2.0 ** 3, 2.0 ** -1, 2.0 ** 2]
    for name, kind, kw in [
        ("sgd nesterov", "sgd", dict(lr=0.02, momentum=0.9, nesterov=True, weight_decay=1e-2)),
        ("sgd dampening", "sgd", dict(lr=0.05, momentum=0.7, dampening=0.5, weight_decay=3e-3)),
        ("adamw", "adamw", dict(lr=1e-3)),
        ("adamw custom", "adamw", dict(lr=1e-2, betas=(0.5, 0.9), eps=1e-4, weight_decay=0.3)),
    ]:
        g = Lcg(12345)
        p = torch.nn.Parameter(torch.from_numpy(g.vals(1000, 1.0)))
        opt = (torch.optim.SGD if kind == "sgd" else torch.optim.AdamW)([p], foreach=False, **kw)
        for s, sc in enumerate(scales):
            for gr in opt.param_groups:
                gr["lr"] = kw["lr"] * (1.0 if s < 2 else 0.7 ** s)
            p.grad = torch.from_numpy(g.vals(1000, sc))
            opt.step()
        st = opt.state[p]
        states = [st["momentum_buffer"]] if kind == "sgd" else [st["exp_avg"], st["exp_avg_sq"]]
        print(name, " ".join("0x%016xull" % fnv(t.detach().numpy().tobytes()) for t in [p] + states))
    g = Lcg(999)
    sizes = [1 + (7 * k * k + 3 * k) % 290 for k in range(21)]
    h = 0xcbf29ce484222325
    for t in range(40):
        base = [g.vals(m, 2.0 ** ((k % 5) - 2)) for k, m in enumerate(sizes)]
        ps = [torch.nn.Parameter(torch.zeros(len(b))) for b in base]
        for q, b in zip(ps, base):
            q.grad = torch.from_numpy(b.copy())
        tn = torch.nn.utils.clip_grad_norm_(ps, 0.05 * (1.25 ** t))
        h = fnv(np.float32(tn.item()).tobytes(), h)
        for q in ps:
            h = fnv(q.grad.numpy().tobytes(), h)
    print("clip hash 0x%016xull, last total norm %s" % (h, hx(tn.item())))
    p = torch.nn.Parameter(torch.zeros(1))
    o = torch.optim.SGD([p], lr=0.3)
    sch = torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.9)
    h = 0xcbf29ce484222325
    for _ in range(40):
        h = fnv(np.float64(o.param_groups[0]["lr"]).tobytes(), h)
        o.step()
        sch.step()
    print("StepLR hash 0x%016xull" % h)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "torch2":
        torch2_refs()
    else:
        loss_refs()
        optim_refs()
        bulk_refs()
