"""PyTorch definitions of the models exported as ONNX fixtures.

Shared by export_fixtures.py (torch 1.13) and export_torch2.py (torch 2.x) so
that both exporters see exactly the same modules.  Every model is small (well
under 2 MB of float32 weights) and is built after torch.manual_seed(seed) so
that the exported initializers are reproducible.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# --------------------------------------------------------------------------
# mlp: [N, 32] -> [N, 10]
# --------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self, d_in=32, d_hidden=64, n_classes=10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.act1 = nn.ReLU()
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.act2 = nn.ReLU()
        self.fc3 = nn.Linear(d_hidden, n_classes)

    def forward(self, x):
        x = self.act1(self.fc1(x))
        x = self.act2(self.fc2(x))
        return self.fc3(x)


# --------------------------------------------------------------------------
# digits_cnn: [N, 1, 8, 8] -> [N, 10]   (sklearn 8x8 digits)
# --------------------------------------------------------------------------
class DigitsCNN(nn.Module):
    def __init__(self, n_classes=10, dropout=0.1):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.relu2 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)              # 8x8 -> 4x4
        self.flatten = nn.Flatten()              # 32*4*4 = 512
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.relu3 = nn.ReLU()
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(64, n_classes)

    def forward(self, x):
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.relu2(self.bn2(self.conv2(x)))
        x = self.flatten(self.pool(x))
        x = self.drop(self.relu3(self.fc1(x)))
        return self.fc2(x)


# --------------------------------------------------------------------------
# resnet: [N, 3, 16, 16] -> [N, 10]
# --------------------------------------------------------------------------
class BasicBlock(nn.Module):
    """conv-bn-relu-conv-bn + shortcut, then relu (ResNet v1 BasicBlock)."""

    def __init__(self, c_in, c_out, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(c_out, c_out, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                nn.BatchNorm2d(c_out),
            )
        else:
            self.downsample = None

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, n_classes=10, width=16):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
        )
        self.layer1 = BasicBlock(width, width, stride=1)          # identity shortcut
        self.layer2 = BasicBlock(width, 2 * width, stride=2)      # 1x1 strided conv shortcut
        self.layer3 = BasicBlock(2 * width, 2 * width, stride=1)  # identity shortcut
        self.pool = nn.AdaptiveAvgPool2d(1)                       # -> GlobalAveragePool
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(2 * width, n_classes)

    def forward(self, x):
        x = self.stem(x)
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(self.flatten(self.pool(x)))


# --------------------------------------------------------------------------
# unet: [N, 3, 16, 16] -> [N, 1, 16, 16]
# --------------------------------------------------------------------------
def conv_in_lrelu(c_in, c_out):
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1),
        nn.InstanceNorm2d(c_out, affine=True),
        nn.LeakyReLU(0.1),
    )


def conv_bn_lrelu(c_in, c_out):
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.LeakyReLU(0.1),
    )


class UNet(nn.Module):
    def __init__(self, c_in=3, c_out=1, base=8):
        super().__init__()
        b = base
        self.enc1 = conv_in_lrelu(c_in, b)           # 16x16, InstanceNorm
        self.pool1 = nn.MaxPool2d(2)                 # -> 8x8
        self.enc2 = conv_bn_lrelu(b, 2 * b)          # 8x8, BatchNorm
        self.pool2 = nn.MaxPool2d(2)                 # -> 4x4
        self.bottleneck = conv_bn_lrelu(2 * b, 4 * b)
        self.drop = nn.Dropout(0.1)
        # level 2 decoder: nearest upsample + conv
        self.up2 = nn.Upsample(scale_factor=2, mode='nearest')   # 4x4 -> 8x8
        self.dec2 = conv_bn_lrelu(4 * b + 2 * b, 2 * b)
        # level 1 decoder: transposed conv
        self.up1 = nn.ConvTranspose2d(2 * b, b, kernel_size=2, stride=2)  # 8x8 -> 16x16
        self.dec1 = conv_in_lrelu(b + b, b)
        self.head = nn.Conv2d(b, c_out, kernel_size=1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool1(e1))
        m = self.drop(self.bottleneck(self.pool2(e2)))
        d2 = self.dec2(torch.cat([self.up2(m), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], dim=1))
        return self.head(d1)


# --------------------------------------------------------------------------
# gpt: int64 [N, 16] -> logits [N, 16, 64]   (nanoGPT-style decoder)
# --------------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout):
        super().__init__()
        assert n_embd % n_head == 0
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head = n_head
        self.n_embd = n_embd
        self.register_buffer(
            "bias",
            torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size),
        )

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v                                                      # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class GPTMLP(nn.Module):
    def __init__(self, n_embd, dropout):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = GPTMLP(n_embd, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, vocab_size=64, block_size=16, n_layer=2, n_embd=32, n_head=4,
                 dropout=0.1):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([Block(n_embd, n_head, block_size, dropout)
                                for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)  # untied

    def forward(self, idx):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# --------------------------------------------------------------------------
# Registry: name -> (constructor, example-input factory, input name, output name)
# --------------------------------------------------------------------------
GPT_VOCAB = 64
GPT_BLOCK = 16


def _float_input(*shape):
    def make(batch):
        g = torch.Generator().manual_seed(1234)
        return torch.randn(batch, *shape, generator=g)
    return make


def _token_input(batch):
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, GPT_VOCAB, (batch, GPT_BLOCK), generator=g, dtype=torch.long)


MODELS = {
    "mlp":        (MLP,       _float_input(32),        "input", "logits"),
    "digits_cnn": (DigitsCNN, _float_input(1, 8, 8),   "input", "logits"),
    "resnet":     (ResNet,    _float_input(3, 16, 16), "input", "logits"),
    "unet":       (UNet,      _float_input(3, 16, 16), "input", "mask_logits"),
    "gpt":        (GPT,       _token_input,            "idx",   "logits"),
}

SEED = 0


def build(name, seed=SEED):
    """Construct model `name` with deterministic initial weights."""
    ctor = MODELS[name][0]
    torch.manual_seed(seed)
    return ctor()
