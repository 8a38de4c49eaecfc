#!/usr/bin/env python3
"""Side-by-side profile of one training step, PyTorch beside gpipe-onnx, per op class:

    python3 bench/profile.py MODEL PRECISION --gpipe build/src/gpipe-onnx \\
        [--batch B] [--steps N] [--torch-variant eager|best|compile] \\
        [--onnx-dir D --reuse-onnx] [--gpipe-args '...'] [--out profile.json] [--markdown profile.md]

    CPU smoke test (tiny models, gpipe-onnx's CPU backend):
    python3 bench/profile.py resnet50 fp32 --tiny --device cpu --gpipe build-cpu/src/gpipe-onnx

The work is in side_profile.py (see its docstring and bench/README.md, "Profile"). This file
only starts it, and is the standard library's `profile` when imported under that name: every
script in bench/ has this folder first on sys.path, and cProfile, which torch._dynamo imports,
does `import profile`; without this, torch.compile in bench.py's or this harness's PyTorch
process would get this file instead.
"""
import os
import sys

if __name__ == "profile":
    import importlib.machinery
    import importlib.util

    _here = os.path.dirname(os.path.abspath(__file__))
    _spec = importlib.machinery.PathFinder.find_spec(
        "profile", [p for p in sys.path if os.path.abspath(p or os.curdir) != _here])
    if _spec is None:
        raise ImportError("the standard library's profile module is not on sys.path")
    _stdlib = importlib.util.module_from_spec(_spec)
    sys.modules["profile"] = _stdlib      # what the import statement hands back
    _spec.loader.exec_module(_stdlib)
elif __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import side_profile
    sys.exit(side_profile.main())
