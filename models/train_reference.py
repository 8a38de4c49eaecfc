"""PyTorch reference run: train digits_cnn on the digits .npy files.

    python3 train_reference.py [--epochs 5]

Uses the same seeded initial weights as digits_cnn_op*.onnx, batch 32,
a fixed shuffling seed, and prints validation accuracy (eval mode, running
BatchNorm statistics) after every epoch for SGD (lr 0.05, momentum 0.9) and
AdamW (lr 1e-3, weight decay 0.01).  A baseline for the C trainer's results;
nothing here is needed to regenerate the fixtures.
"""
import argparse
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fixture_models as fm  # noqa: E402


def load(split):
    x = np.load(os.path.join(HERE, f"digits_{split}_x.npy"))
    y = np.load(os.path.join(HERE, f"digits_{split}_y.npy"))
    return torch.from_numpy(x), torch.from_numpy(y)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    xtr, ytr = load("train")
    xva, yva = load("val")
    for opt_name in ("sgd", "adamw"):
        model = fm.build("digits_cnn")
        if opt_name == "sgd":
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        gen = torch.Generator().manual_seed(0)
        for epoch in range(args.epochs):
            model.train()
            perm = torch.randperm(len(xtr), generator=gen)
            for i in range(0, len(xtr), args.batch):
                idx = perm[i:i + args.batch]
                loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
            model.eval()
            with torch.no_grad():
                acc = (model(xva).argmax(1) == yva).float().mean().item()
            print(f"{opt_name:5s} epoch {epoch + 1}: last batch loss {loss.item():.4f}"
                  f"  val acc {acc:.4f}")


if __name__ == "__main__":
    main()
