"""Write the sklearn 8x8 digits dataset as .npy files for training tests.

    python3 make_digits.py [--out-dir DIR]

x: float32 [N, 1, 8, 8], pixel values divided by 16 (range [0, 1]).
y: int64 [N], class 0..9.
Split: stratified 80/20 with sklearn's train_test_split(random_state=0)
-> 1437 train / 360 validation samples.
"""
import argparse
import os

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

SEED = 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=os.path.dirname(os.path.abspath(__file__)))
    args = ap.parse_args()
    d = load_digits()
    x = (d.data.astype(np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    y = d.target.astype(np.int64)
    xtr, xva, ytr, yva = train_test_split(
        x, y, test_size=0.2, random_state=SEED, stratify=y)
    out = {
        "digits_train_x.npy": np.ascontiguousarray(xtr, dtype=np.float32),
        "digits_train_y.npy": np.ascontiguousarray(ytr, dtype=np.int64),
        "digits_val_x.npy": np.ascontiguousarray(xva, dtype=np.float32),
        "digits_val_y.npy": np.ascontiguousarray(yva, dtype=np.int64),
    }
    for name, arr in out.items():
        np.save(os.path.join(args.out_dir, name), arr)
        print(f"  {name:22s} {arr.dtype} {list(arr.shape)}")


if __name__ == "__main__":
    main()
