"""The benchmark models (models.py) as lists of units in execution order, to be cut into
pipeline stages for torch.distributed.pipelining (pipeline.py).

A unit is an nn.Module that maps the pipeline state, a tuple of tensors, to the next
state. For ResNet-50 and GPT-2 the state is one tensor; for the U-Net it is the current
feature map followed by the skip tensors kept so far (encoder outputs that a decoder
level will concatenate), so a cut anywhere carries the long skips across the stage
boundary, as gpipe-onnx's frontier does.

    resnet50  stem (conv1, bn1, relu, maxpool), each Bottleneck block (layer1.0 ...
              layer4.2), head (avgpool, flatten, fc)
    gpt2      embed (wte + wpe), per block its attention half (ln_1, attn, residual)
              and its MLP half (ln_2, mlp, residual), head (ln_f, lm_head)
    unet      each conv-dropout-norm-LeakyReLU of every cell (encoders.i.j with the
              skip kept and the max-pool after a level's last one, bottleneck.j,
              decoders.i.j with the upsample and concatenation before a level's first
              one), segment (the 1x1 convolution)

Units hold the model's own submodules (no copies), so a unit's parameters are the
model's. Runs under torch 1.13 and 2.x.
"""
import torch
import torch.nn as nn


class _Fn(nn.Module):
    """A unit whose state is one tensor: state -> (f(state),)."""

    def __init__(self, **mods):
        super().__init__()
        for k, v in mods.items():
            setattr(self, k, v)

    def forward(self, x):
        return (self.f(x),)


class _ResNetStem(_Fn):
    def f(self, x):
        return self.maxpool(self.relu(self.bn1(self.conv1(x))))


class _ResNetBlock(_Fn):
    def f(self, x):
        return self.block(x)


class _ResNetHead(_Fn):
    def f(self, x):
        return self.fc(torch.flatten(self.avgpool(x), 1))


class _GPTEmbed(_Fn):
    def f(self, idx):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        return self.wte(idx) + self.wpe(pos)


class _GPTAttn(_Fn):
    def f(self, x):
        return x + self.attn(self.ln_1(x))


class _GPTMLP(_Fn):
    def f(self, x):
        return x + self.mlp(self.ln_2(x))


class _GPTHead(_Fn):
    def f(self, x):
        return self.lm_head(self.ln_f(x))


class _UNetEncoder(nn.Module):
    """One conv unit of an encoder level; after the level's last one, keeps its output
    as a skip and max-pools."""

    def __init__(self, unit, pool=None):
        super().__init__()
        self.unit = unit
        self.pool = pool

    def forward(self, x, *skips):
        x = self.unit(x)
        if self.pool is None:
            return (x,) + skips
        return (self.pool(x),) + skips + (x,)


class _UNetMiddle(nn.Module):
    def __init__(self, unit):
        super().__init__()
        self.unit = unit

    def forward(self, x, *skips):
        return (self.unit(x),) + skips


class _UNetDecoder(nn.Module):
    """One conv unit of a decoder level; before the level's first one, upsamples and
    concatenates the deepest skip still kept."""

    def __init__(self, unit, up=None):
        super().__init__()
        self.unit = unit
        self.up = up

    def forward(self, x, *skips):
        if self.up is not None:
            x = torch.cat((self.up(x), skips[-1]), dim=1)
            skips = skips[:-1]
        return (self.unit(x),) + skips


class _UNetSegment(nn.Module):
    def __init__(self, conv):
        super().__init__()
        self.conv = conv

    def forward(self, x, *skips):
        assert not skips
        return (self.conv(x),)


def units(name, model):
    """[(unit name, unit module)] of a models.build(name) model, in execution order."""
    out = []
    if name == "resnet50":
        out.append(("stem", _ResNetStem(conv1=model.conv1, bn1=model.bn1, relu=model.relu,
                                        maxpool=model.maxpool)))
        for li in range(1, 5):
            layer = getattr(model, "layer%d" % li)
            for bi, block in enumerate(layer):
                out.append(("layer%d.%d" % (li, bi), _ResNetBlock(block=block)))
        out.append(("head", _ResNetHead(avgpool=model.avgpool, fc=model.fc)))
    elif name == "gpt2":
        out.append(("embed", _GPTEmbed(wte=model.wte, wpe=model.wpe)))
        for i, b in enumerate(model.h):
            out.append(("h.%d.attn" % i, _GPTAttn(ln_1=b.ln_1, attn=b.attn)))
            out.append(("h.%d.mlp" % i, _GPTMLP(ln_2=b.ln_2, mlp=b.mlp)))
        out.append(("head", _GPTHead(ln_f=model.ln_f, lm_head=model.lm_head)))
    elif name == "unet":
        for i, cell in enumerate(model.encoders):
            for j, u in enumerate(cell):
                last = j == len(cell) - 1
                out.append(("encoders.%d.%d" % (i, j), _UNetEncoder(u, model.pool if last else None)))
        for j, u in enumerate(model.bottleneck):
            out.append(("bottleneck.%d" % j, _UNetMiddle(u)))
        for i in reversed(range(len(model.decoders))):
            for j, u in enumerate(model.decoders[i]):
                out.append(("decoders.%d.%d" % (i, j), _UNetDecoder(u, model.up if j == 0 else None)))
        out.append(("segment", _UNetSegment(model.segment)))
    else:
        raise ValueError("unknown model %r" % name)
    return out


class Part(nn.Module):
    """Consecutive units as one stage: forward(*state) -> the next state (a tensor when
    it is one tensor, else a tuple)."""

    def __init__(self, unit_list):
        super().__init__()
        self.names = [n for n, _ in unit_list]
        self.units = nn.ModuleList([u for _, u in unit_list])

    def forward(self, *state):
        for u in self.units:
            state = u(*state)
        return state[0] if len(state) == 1 else state


def split(name, model, cuts):
    """The model as len(cuts)+1 Parts; cuts are unit indices where a new part starts
    (increasing, within 1..len(units)-1)."""
    us = units(name, model)
    bounds = [0] + list(cuts) + [len(us)]
    for a, b in zip(bounds, bounds[1:]):
        if not a < b:
            raise ValueError("cuts %r do not split %d units into non-empty parts" % (cuts, len(us)))
    return [Part(us[a:b]) for a, b in zip(bounds, bounds[1:])]


def unit_params(name, model):
    """[(unit name, parameter count)] in execution order."""
    return [(n, sum(p.numel() for p in u.parameters())) for n, u in units(name, model)]


def unit_param_names(name, model, prefix=""):
    """[(unit name, [qualified parameter names])] in execution order; `prefix` is put
    before every name (export.py exports the U-Net wrapped, as 'net.')."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [(n, [prefix + names[id(p)] for p in u.parameters()]) for n, u in units(name, model)]


def choose_cuts(values, targets):
    """Cut points for len(targets)+1 parts of n units: values[j] (j = 0..n) is the
    position of the boundary before unit j in some measure (cumulative parameters,
    the layer index of the unit's first layer in gpipe-onnx's list); for each target
    position, the boundary j in 1..n-1 nearest to it, keeping the parts non-empty and
    in order. Returns [j]."""
    n = len(values) - 1
    K = len(targets) + 1
    cuts = []
    lo = 1
    for s, target in enumerate(targets):
        hi = n - (K - 1 - s)                       # leave a unit for every later part
        best = min(range(lo, hi + 1), key=lambda j: (abs(values[j] - target), j))
        cuts.append(best)
        lo = best + 1
    return cuts


def check(name, tiny=True, batch=2):
    """The parts chained equal the model's forward (a self-test)."""
    import models as bm
    model = bm.build(name, tiny).eval()
    x, _ = bm.make_batch(name, batch, tiny)
    us = units(name, model)
    with torch.no_grad():
        ref = model(x)
        for cut in (1, len(us) // 2, len(us) - 1):
            a, b = split(name, model, [cut])
            out = b(*_as_tuple(a(x)))
            assert torch.allclose(out, ref, atol=1e-5), (name, cut)
    assert sum(c for _, c in unit_params(name, model)) == bm.param_count(model), name
    return len(us)


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


if __name__ == "__main__":
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    for m in ("resnet50", "gpt2", "unet"):
        print(m, check(m), "units: parts chained equal the model")
