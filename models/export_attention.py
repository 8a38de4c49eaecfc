"""Export the attention fixtures (tests/data/attention/*.onnx) that the
attention fusion's tests (tests/test_fuse_attention.c) load: each spelling
of scaled dot-product attention the fusion recognizes, as torch's exporter
writes it, and near misses that must stay unfused. Tiny sizes (batch 2,
8 tokens, width 16, 2 heads), so the files stay a few kilobytes.

    /usr/bin/python3 models/export_attention.py [--out tests/data/attention]
    python3 models/export_attention.py --torch2 [--out tests/data/attention]

Torch 1.13 (Debian's python3-torch); exported in training mode without
constant folding, as export_fixtures.py does. --torch2 (torch >= 2.5)
writes the spellings of torch 2.x instead: F.scaled_dot_product_attention
through the TorchScript exporter (<name>_torch2_op17.onnx) and, with the
explicit attention too, the dynamo exporter's with optimize off and on
(<name>_dynamo.onnx, <name>_dynamo_opt.onnx).
"""
import argparse
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

B, T, C, H = 2, 8, 16, 2


class NanoGPT(nn.Module):
    """bench/models.py's CausalSelfAttention: the `bias` buffer sliced and
    compared into a masked_fill, the head split and merge around it."""

    def __init__(self, dropout=None):
        super().__init__()
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        # As bench/models.py, no attention dropout; with one (the fixture
        # GPT's), a Dropout node between the Softmax and the MatMul.
        self.attn_dropout = nn.Dropout(dropout) if dropout is not None else nn.Identity()
        self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

    def forward(self, x):
        b, t, c = x.size()
        hs = c // H
        q, k, v = self.c_attn(x).split(C, dim=2)
        k = k.view(b, t, H, hs).transpose(1, 2)
        q = q.view(b, t, H, hs).transpose(1, 2)
        v = v.view(b, t, H, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class NanoGPTSDPA(NanoGPT):
    """The same block with F.scaled_dot_product_attention (torch >= 2)."""

    def forward(self, x):
        b, t, c = x.size()
        hs = c // H
        q, k, v = self.c_attn(x).split(C, dim=2)
        k = k.view(b, t, H, hs).transpose(1, 2)
        q = q.view(b, t, H, hs).transpose(1, 2)
        v = v.view(b, t, H, hs).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class Heads(nn.Module):
    """[B, H, T, D] attention with a variant of the scores' spelling."""

    def __init__(self, variant):
        super().__init__()
        self.variant = variant
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.temperature = nn.Parameter(torch.tensor(0.5))
        pad = torch.zeros(1, 1, 1, T)
        pad[..., T - 2:] = float("-inf")  # the last two keys padded away
        self.register_buffer("pad", pad)

    def forward(self, x):
        b, t, c = x.size()
        hs = c // H
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(b, t, H, hs).permute(0, 2, 1, 3)
        k = k.view(b, t, H, hs).permute(0, 2, 1, 3)
        v = v.view(b, t, H, hs).permute(0, 2, 1, 3)
        s = self.variant
        extra = None
        if s == "div_add":  # Hugging Face: scores / sqrt(d) + additive padding mask
            pad = torch.where(torch.arange(t) >= t - 2, torch.tensor(float("-inf")), torch.tensor(0.0))
            att = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hs) + pad
        elif s == "param_mask":  # near miss: the mask a float buffer (a trainable initializer in ONNX)
            att = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hs) + self.pad
        elif s == "sqrt_scaled":  # Q and K each scaled by d^-1/4, no mask
            f = hs ** -0.25
            att = torch.matmul(q * f, k.transpose(-1, -2) * f)
        elif s == "q_scaled_where":  # Q scaled first, Where(keep, scores, -1e9)
            keep = torch.tril(torch.ones(t, t, dtype=torch.bool))
            att = torch.where(keep, (q / math.sqrt(hs)) @ k.transpose(-1, -2), torch.tensor(-1e9))
        elif s == "softmax_dim2":  # near miss: softmax over the queries
            att = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hs)
            y = F.softmax(att, dim=-2) @ v
            return self.proj(y.transpose(1, 2).reshape(b, t, c))
        elif s == "param_scale":  # near miss: the scale is a parameter
            att = torch.matmul(q, k.transpose(-1, -2)) * self.temperature
        elif s == "input_mask":  # near miss: the mask depends on the input
            att = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hs) + (x[:, None, :, :1] * 0.1)
        elif s == "scores_out":  # near miss: the scores also a model output
            att = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hs)
            extra = att
        else:
            raise ValueError(s)
        y = F.softmax(att, dim=-1) @ v
        out = self.proj(y.transpose(1, 2).reshape(b, t, c))
        return (out, extra) if extra is not None else out


class MHA(nn.Module):
    """nn.MultiheadAttention, self-attention, batch first."""

    def __init__(self, mask=None):
        super().__init__()
        self.mha = nn.MultiheadAttention(C, H, dropout=0.0, batch_first=True)
        self.mask = mask
        if mask == "bool_causal":
            self.register_buffer("m", torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1))

    def forward(self, x):
        # Float masks made in forward (nn.Transformer's square subsequent
        # mask, a band), so that they export as constants; a float buffer
        # would be a trainable initializer.
        i = torch.arange(x.size(1))
        if self.mask == "float_causal":
            m = torch.where(i[None, :] > i[:, None], torch.tensor(float("-inf")), torch.tensor(0.0))
        elif self.mask == "float_band":  # keys more than 2 away masked: not causal
            m = torch.where((i[:, None] - i[None, :]).abs() > 2, torch.tensor(float("-inf")), torch.tensor(0.0))
        else:
            m = getattr(self, "m", None)
        return self.mha(x, x, x, attn_mask=m, need_weights=False)[0]


def fixtures():
    yield "nanogpt", NanoGPT(), (13, 17)
    yield "nanogpt_dropout", NanoGPT(dropout=0.1), (17,)
    yield "nanogpt_dropout0", NanoGPT(dropout=0.0), (17,)
    for v in ("div_add", "param_mask", "sqrt_scaled", "q_scaled_where", "softmax_dim2", "param_scale", "input_mask",
              "scores_out"):
        yield v, Heads(v), (17,)
    yield "mha", MHA(), (13, 17)
    for m in ("float_causal", "bool_causal", "float_band"):
        yield "mha_" + m, MHA(m), (14,)


def export_torch2(out, x):
    """torch 2.x: SDPA through the TorchScript exporter, and the dynamo exporter's forms."""
    import warnings
    warnings.filterwarnings("ignore")
    common = dict(input_names=["x"], output_names=["y"], training=torch.onnx.TrainingMode.TRAINING,
                  dynamic_axes={"x": {0: "batch"}})
    jobs = [("nanogpt_sdpa_torch2_op17", NanoGPTSDPA(), dict(dynamo=False, opset_version=17,
                                                            do_constant_folding=False))]
    for name, model in (("nanogpt_sdpa", NanoGPTSDPA()), ("nanogpt", NanoGPT()), ("mha", MHA())):
        jobs.append((name + "_dynamo", model, dict(dynamo=True, optimize=False, external_data=False)))
        jobs.append((name + "_dynamo_opt", model, dict(dynamo=True, optimize=True, external_data=False)))
    for name, model, extra in jobs:
        model.train()
        path = os.path.join(out, name + ".onnx")
        try:
            torch.onnx.export(model, (x,), path, **common, **extra)
            print(f"{path}: {os.path.getsize(path)} bytes")
        except Exception as e:  # noqa: BLE001 - report every export's outcome
            print(f"{path}: failed: {type(e).__name__}: {str(e)[:300]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "attention"))
    ap.add_argument("--torch2", action="store_true", help="torch 2.x's spellings (see above)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    x = torch.randn(B, T, C)
    if args.torch2:
        export_torch2(args.out, x)
        return
    for name, model, opsets in fixtures():
        model.train()
        for opset in opsets:
            path = os.path.join(args.out, f"{name}_op{opset}.onnx")
            outs = ["y", "scores"] if name == "scores_out" else ["y"]
            torch.onnx.export(model, (x,), path, input_names=["x"], output_names=outs, opset_version=opset,
                              training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                              dynamic_axes={"x": {0: "batch"}})
            print(f"{path}: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
