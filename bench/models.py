"""The three benchmark models of our performance targets, in PyTorch.

    resnet50  torchvision's ResNet-50, 1000 classes, 3x224x224, cross-entropy
    gpt2      GPT-2 small: 12 pre-LayerNorm blocks, 768 channels, 12 heads, vocabulary
              50304, context 1024, token + position embeddings, untied head,
              cross-entropy on next tokens
    unet      torchgpipe's U-Net benchmark model (depth 5, 64 base channels, 5 convs
              per cell), 3x192x192, BCE-with-logits against a target of ones

Every model has a full size (the benchmark) and a tiny size (`tiny=True`) with the same
structure, for a CPU smoke test. Runs under torch 1.13 and torch 2.x.

The code is written so that the legacy ONNX exporter (torch.onnx.export, opset 17,
TrainingMode.TRAINING) emits only ops gpipe-onnx trains:

- GPT-2 attention uses plain ops: MatMul, a constant causal mask (a float `tril` buffer,
  compared with 0 and applied with masked_fill -> Where, so the mask is never a trainable
  value), Softmax. No F.scaled_dot_product_attention (unless `sdpa=True`, which only the
  PyTorch side may use).
- GELU is nn.GELU() (exact, erf form), which opset 17 exports as Div/Erf/Add/Mul/Mul.
- The U-Net's loss, BCE-with-logits against ones, is mathematically softplus(-logits)
  per element; `UNetLoss` folds that into the exported model (see export.py).
"""
import math
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F

MODEL_NAMES = ("resnet50", "gpt2", "unet")

# Per model and size: the constructor's configuration, the batch the benchmark uses,
# and the shape of one sample.
CONFIGS = {
    "resnet50": {
        "full": {"classes": 1000, "image": 224, "batch": 128},
        # Same torchvision ResNet class and Bottleneck blocks, one block per stage and
        # narrow bottlenecks (width_per_group=16).
        "tiny": {"classes": 10, "image": 32, "batch": 4, "layers": [1, 1, 1, 1],
                 "width_per_group": 16},
    },
    "gpt2": {
        "full": {"vocab": 50304, "block": 1024, "layers": 12, "embd": 768, "heads": 12,
                 "batch": 16},
        "tiny": {"vocab": 512, "block": 64, "layers": 2, "embd": 64, "heads": 4, "batch": 4},
    },
    "unet": {
        "full": {"depth": 5, "base": 64, "convs": 5, "image": 192, "batch": 40},
        "tiny": {"depth": 3, "base": 8, "convs": 2, "image": 32, "batch": 4},
    },
}


def config(name, tiny=False):
    return CONFIGS[name]["tiny" if tiny else "full"]


# --------------------------------------------------------------------------
# ResNet-50 (torchvision)
# --------------------------------------------------------------------------
def resnet50(tiny=False):
    import torchvision
    cfg = config("resnet50", tiny)
    if not tiny:
        return torchvision.models.resnet50(num_classes=cfg["classes"])
    from torchvision.models.resnet import Bottleneck, ResNet
    return ResNet(Bottleneck, cfg["layers"], num_classes=cfg["classes"],
                  width_per_group=cfg["width_per_group"])


# --------------------------------------------------------------------------
# GPT-2 small (nanoGPT layout, no dropout, untied head)
# --------------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        assert n_embd % n_head == 0
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head
        self.n_embd = n_embd
        self.sdpa = False     # PyTorch side only: F.scaled_dot_product_attention
        # Constant causal mask: 1 on and below the diagonal.
        self.register_buffer(
            "bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)      # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v                                          # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()                                    # exact (erf) GELU
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, vocab, block, layers, embd, heads):
        super().__init__()
        self.wte = nn.Embedding(vocab, embd)
        self.wpe = nn.Embedding(block, embd)
        self.h = nn.ModuleList([Block(embd, heads, block) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(embd)
        self.lm_head = nn.Linear(embd, vocab, bias=False)        # untied
        # nanoGPT's initialization (irrelevant to speed; keeps the loss finite)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)

    def use_sdpa(self, on=True):
        for b in self.h:
            b.attn.sdpa = on

    def forward(self, idx):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt2(tiny=False):
    c = config("gpt2", tiny)
    return GPT(c["vocab"], c["block"], c["layers"], c["embd"], c["heads"])


# --------------------------------------------------------------------------
# torchgpipe's U-Net (benchmarks/models/unet), as a plain module
# --------------------------------------------------------------------------
def conv_dropout_norm_relu(c_in, c_out):
    return nn.Sequential(OrderedDict([
        ("conv", nn.Conv2d(c_in, c_out, kernel_size=3, padding=1, bias=False)),
        # torchgpipe uses Dropout2d, which cannot be exported in training mode: plain
        # dropout on both sides (as our targets specify).
        ("dropout", nn.Dropout(p=0.1)),
        ("norm", nn.InstanceNorm2d(c_out)),          # affine=False, no running stats
        ("relu", nn.LeakyReLU(negative_slope=1e-2)),
    ]))


def cell(c_in, c_mid, c_out, convs):
    if convs == 1:
        return nn.Sequential(conv_dropout_norm_relu(c_in, c_out))
    layers = [conv_dropout_norm_relu(c_in, c_mid)]
    layers += [conv_dropout_norm_relu(c_mid, c_mid) for _ in range(convs - 2)]
    layers.append(conv_dropout_norm_relu(c_mid, c_out))
    return nn.Sequential(*layers)


class UNet(nn.Module):
    """Encoder level i: a cell to base*2^i channels, its output kept for the long skip,
    then a 2x2 max-pool. Bottleneck: base*2^(d-1) -> base*2^d -> base*2^(d-1). Decoder
    level i (deepest first): nearest 2x upsample, concatenation with encoder level i's
    output, a cell from base*2^(i+1) to base*2^(i-1) channels. Then a 1x1 convolution
    without bias to 1 channel. The input side must be divisible by 2^depth."""

    def __init__(self, depth=5, base=64, convs=5, c_in=3, c_out=1):
        super().__init__()
        self.encoders = nn.ModuleList([
            cell(c_in if i == 0 else base * 2 ** (i - 1), base * 2 ** i, base * 2 ** i, convs)
            for i in range(depth)])
        self.pool = nn.MaxPool2d(2, stride=2)
        self.bottleneck = cell(base * 2 ** (depth - 1), base * 2 ** depth,
                               base * 2 ** (depth - 1), convs)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.decoders = nn.ModuleList([
            cell(base * 2 ** (i + 1), base * 2 ** i // 2, base * 2 ** i // 2, convs)
            for i in range(depth)])                   # index i = level i
        self.segment = nn.Conv2d(base // 2, c_out, kernel_size=1, bias=False)

    def forward(self, x):
        skips = []
        for enc in self.encoders:
            x = enc(x)
            skips.append(x)
            x = self.pool(x)
        x = self.bottleneck(x)
        for i in reversed(range(len(self.decoders))):
            x = torch.cat((self.up(x), skips[i]), dim=1)
            x = self.decoders[i](x)
        return self.segment(x)


def unet(tiny=False):
    c = config("unet", tiny)
    return UNet(depth=c["depth"], base=c["base"], convs=c["convs"])


class UNetLoss(nn.Module):
    """The U-Net with its loss folded in: per-element BCE-with-logits against a target
    of ones, i.e. softplus(-logits) = log(1 + exp(-logits)) (exactly the same function:
    BCE(x, 1) = max(x, 0) - x + log(1 + exp(-|x|)) = softplus(-x)). Its mean over all
    elements is F.binary_cross_entropy_with_logits(logits, ones), which gpipe-onnx
    computes with --loss output (mean of the output)."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return F.softplus(-self.net(x))


# --------------------------------------------------------------------------
# Registry, data and losses (the PyTorch side of the benchmark)
# --------------------------------------------------------------------------
BUILDERS = {"resnet50": resnet50, "gpt2": gpt2, "unet": unet}


def build(name, tiny=False, seed=0):
    torch.manual_seed(seed)
    return BUILDERS[name](tiny)


def sample_shape(name, tiny=False):
    """(shape of one input sample, dtype) as the exported model declares it."""
    c = config(name, tiny)
    if name == "gpt2":
        return (c["block"],), torch.long
    return (3, c["image"], c["image"]), torch.float32


def make_batch(name, batch, tiny=False, device="cpu", seed=0):
    """Synthetic (input, target) of the benchmark's shapes, on `device`."""
    c = config(name, tiny)
    g = torch.Generator(device="cpu").manual_seed(seed)
    if name == "resnet50":
        x = torch.randn(batch, 3, c["image"], c["image"], generator=g)
        y = torch.randint(0, c["classes"], (batch,), generator=g)
    elif name == "gpt2":
        x = torch.randint(0, c["vocab"], (batch, c["block"]), generator=g)
        y = torch.randint(0, c["vocab"], (batch, c["block"]), generator=g)
    else:
        x = torch.rand(batch, 3, c["image"], c["image"], generator=g)
        y = torch.ones(batch, 1, c["image"], c["image"])
    return x.to(device), y.to(device)


def loss(name, out, y):
    """The objective the PyTorch side minimizes; gpipe-onnx minimizes the same one:
    softmax cross-entropy against int64 labels (mean over samples, or over B*T tokens
    for GPT-2) and, for the U-Net, the mean of the exported model's per-element
    softplus(-logits)."""
    if name == "resnet50":
        return F.cross_entropy(out, y)
    if name == "gpt2":
        return F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1))
    return F.binary_cross_entropy_with_logits(out, y)


def param_count(model):
    return sum(p.numel() for p in model.parameters())
