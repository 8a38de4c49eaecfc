"""Writes the small .npy files test_npy.c reads: real numpy output for every
dtype, every format version, big-endian data and Fortran order.
Run from this folder with numpy installed: python3 make.py"""
import numpy as np
from numpy.lib import format as npf

v = np.array([[0.0, -1.5, 3.25], [1e-3, 65504.0, -2.0]])
ints = np.array([[0, -1, 2], [-3, 100, -128]])
arrays = {
    "f4": v.astype("<f4"),
    "f8": v.astype("<f8"),
    "f2": v.astype("<f2"),
    "i8": (ints * 1000003).astype("<i8"),
    "i4": (ints * 1001).astype("<i4"),
    "i2": (ints * 11).astype("<i2"),
    "i1": ints.astype("|i1"),
    "u1": np.array([[0, 1, 2], [127, 128, 255]], dtype="|u1"),
    "u2": np.array([[0, 1, 2], [300, 40000, 65535]], dtype="<u2"),
    "u4": np.array([[0, 1, 2], [70000, 3000000000, 4294967295]], dtype="<u4"),
    "u8": np.array([[0, 1, 2], [70000, 3000000000, 2**62]], dtype="<u8"),
    "b1": np.array([[True, False, True], [False, False, True]]),
}
for name, a in arrays.items():
    np.save(f"{name}.npy", a)
np.save("scalar.npy", np.float32(2.5))
np.save("empty.npy", np.zeros((0, 3), dtype="<f4"))
np.save("rank1.npy", np.arange(5, dtype="<i8"))
np.save("labels_f4.npy", np.array([3, 0, 9, 1], dtype="<f4"))
np.save("rank8.npy", np.arange(2 * 1 * 2 * 1 * 1 * 2 * 1 * 1, dtype="<f4").reshape(2, 1, 2, 1, 1, 2, 1, 1))
np.save("big_f4.npy", v.astype(">f4"))
np.save("big_i8.npy", (ints * 1000003).astype(">i8"))
np.save("fortran.npy", np.asfortranarray(v.astype("<f4")))
for ver in [(2, 0), (3, 0)]:
    with open(f"f4_v{ver[0]}.npy", "wb") as f:
        npf.write_array(f, v.astype("<f4"), version=ver)
