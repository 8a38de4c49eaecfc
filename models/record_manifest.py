"""Record manifest.json: structure and reference shapes of every fixture.

Run with an interpreter that has `onnx`, `onnxruntime` and `numpy`
(see regenerate.sh):

    python3 record_manifest.py [--dir DIR] [--out manifest.json]

For every *.onnx file in DIR this records the opset, producer, node/op
counts, graph inputs/outputs (symbolic dims as their dim_param string),
initializers and parameter count, and the concrete shape of every node
output when the batch dim is bound to 3.  The per-value shapes are obtained
by exposing every node output as a graph output and running onnxruntime on
seeded random input (token ids drawn inside the embedding's range).  The
final output shapes are also recorded at batch 5.
"""
import argparse
import collections
import glob
import hashlib
import json
import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, numpy_helper

INPUT_SEED = 0
BATCHES_FULL = (3,)      # every intermediate value recorded
BATCHES_OUTPUT = (5,)    # final outputs only

FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16,
               TensorProto.BFLOAT16}


def elem_name(code):
    return TensorProto.DataType.Name(code).lower()


def dims_of(type_proto):
    tt = type_proto.tensor_type
    if not tt.HasField("shape"):
        return None
    out = []
    for d in tt.shape.dim:
        if d.HasField("dim_param"):
            out.append(d.dim_param)
        elif d.HasField("dim_value"):
            out.append(int(d.dim_value))
        else:
            out.append(None)
    return out


def value_info_json(vi):
    return {
        "name": vi.name,
        "elem_type": elem_name(vi.type.tensor_type.elem_type),
        "elem_type_code": int(vi.type.tensor_type.elem_type),
        "shape": dims_of(vi.type),
    }


def index_range_for(model, input_name):
    """Upper bound for integer inputs: rows of the embedding table they index."""
    inits = {t.name: t for t in model.graph.initializer}
    highs = [int(inits[n.input[0]].dims[0]) for n in model.graph.node
             if n.op_type == "Gather" and len(n.input) == 2
             and n.input[1] == input_name and n.input[0] in inits]
    return min(highs) if highs else 2


def make_feeds(model, batch):
    rng = np.random.default_rng(INPUT_SEED)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        shape = [batch if not isinstance(d, int) else d for d in dims_of(vi.type)]
        code = vi.type.tensor_type.elem_type
        if code in (TensorProto.INT64, TensorProto.INT32):
            high = index_range_for(model, vi.name)
            dt = np.int64 if code == TensorProto.INT64 else np.int32
            feeds[vi.name] = rng.integers(0, high, size=shape).astype(dt)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def ort_runner(model):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def run_all_values(model, batch):
    """Shapes and elem types of every node output (graph outputs included)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    names = []
    for n in m.graph.node:
        for o in n.output:
            if o and o not in names:
                names.append(o)
                if o not in have:
                    m.graph.output.append(onnx.ValueInfoProto(name=o))
    sess = ort_runner(m)
    out_names = [o.name for o in sess.get_outputs()]
    res = sess.run(out_names, make_feeds(model, batch))
    got = dict(zip(out_names, res))
    shapes = collections.OrderedDict()
    types = collections.OrderedDict()
    for name in names:
        arr = np.asarray(got[name])
        shapes[name] = [int(s) for s in arr.shape]
        types[name] = elem_name(onnx.helper.np_dtype_to_tensor_dtype(arr.dtype))
    return shapes, types


def run_outputs(model, batch):
    sess = ort_runner(model)
    out_names = [o.name for o in sess.get_outputs()]
    res = sess.run(out_names, make_feeds(model, batch))
    return {n: [int(s) for s in np.asarray(r).shape] for n, r in zip(out_names, res)}


def describe(path):
    with open(path, "rb") as f:
        raw = f.read()
    model = onnx.load_from_string(raw)
    onnx.checker.check_model(model)
    g = model.graph
    opsets = {(o.domain or ""): int(o.version) for o in model.opset_import}
    init_names = {t.name for t in g.initializer}
    inits = []
    param_count = 0
    for t in g.initializer:
        numel = int(np.prod(t.dims)) if len(t.dims) else 1
        inits.append({"name": t.name, "dims": [int(d) for d in t.dims],
                      "elem_type": elem_name(t.data_type)})
        if t.data_type in FLOAT_TYPES:
            param_count += numel
    op_counts = collections.Counter(n.op_type for n in g.node)
    entry = collections.OrderedDict()
    entry["file"] = os.path.basename(path)
    entry["bytes"] = len(raw)
    entry["sha256"] = hashlib.sha256(raw).hexdigest()
    entry["ir_version"] = int(model.ir_version)
    entry["opset"] = opsets.get("", None)
    entry["opset_imports"] = opsets
    entry["producer_name"] = model.producer_name
    entry["producer_version"] = model.producer_version
    entry["node_count"] = len(g.node)
    entry["op_counts"] = dict(sorted(op_counts.items()))
    entry["inputs"] = [value_info_json(vi) for vi in g.input if vi.name not in init_names]
    entry["outputs"] = [value_info_json(vi) for vi in g.output]
    entry["initializer_count"] = len(g.initializer)
    entry["param_count"] = param_count
    entry["initializers"] = inits
    for b in BATCHES_FULL:
        shapes, types = run_all_values(model, b)
        entry[f"batch{b}"] = {
            "input_shapes": {k: list(v.shape) for k, v in make_feeds(model, b).items()},
            "output_shapes": run_outputs(model, b),
            "value_shapes": shapes,
            "value_elem_types": types,
        }
    for b in BATCHES_OUTPUT:
        entry[f"batch{b}"] = {
            "input_shapes": {k: list(v.shape) for k, v in make_feeds(model, b).items()},
            "output_shapes": run_outputs(model, b),
        }
    return entry


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=here)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = args.out or os.path.join(args.dir, "manifest.json")
    files = sorted(glob.glob(os.path.join(args.dir, "*.onnx")))
    manifest = collections.OrderedDict()
    manifest["format"] = 1
    manifest["recorded_with"] = {"onnx": onnx.__version__,
                                 "onnxruntime": ort.__version__,
                                 "numpy": np.__version__}
    manifest["input_seed"] = INPUT_SEED
    manifest["fixtures"] = collections.OrderedDict()
    for path in files:
        e = describe(path)
        manifest["fixtures"][e["file"]] = e
        ops = ", ".join(f"{k}x{v}" for k, v in e["op_counts"].items())
        print(f"{e['file']}: opset {e['opset']} {e['producer_name']} "
              f"{e['producer_version']} nodes={e['node_count']} "
              f"params={e['param_count']} out@3={e['batch3']['output_shapes']}")
        print(f"    {ops}")
    with open(out, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.relpath(out)} ({len(files)} fixtures)")


if __name__ == "__main__":
    main()
