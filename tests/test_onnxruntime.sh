#!/usr/bin/env bash
# A model trained and saved by gpipe-onnx loads in onnxruntime and gives the
# outputs of our own forward pass: in evaluation mode (trained weights and
# BatchNorm running statistics) and in training mode (batch statistics), also
# when it was trained in bf16 (the saved weights are the float32 masters).
# Skips (77) without the Python environment of scripts/python_env.sh.
set -euo pipefail
bin="$1"
root="${GP_SOURCE_ROOT:?}"
py="$root/.cache/venv/bin/python"
if ! "$py" -c "import onnxruntime" 2>/dev/null; then
    echo "skipped: no onnxruntime (run scripts/python_env.sh)"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
m="$root/models"

# digits: one epoch of AdamW (the default recipe) then evaluation mode.
"$bin" train "$m/digits_cnn_op17.onnx" --epochs 1 --quiet --save "$tmp/digits.onnx" >/dev/null
"$bin" predict "$tmp/digits.onnx" --data "$m/digits_val_x.npy" --output "$tmp/digits_ours.npy"
# digits trained in bf16: the saved model holds the float32 master weights,
# which onnxruntime runs as any float32 model.
"$bin" train "$m/digits_cnn_op17.onnx" --epochs 1 --precision bf16 --quiet --save "$tmp/digits_bf16.onnx" >/dev/null
"$bin" predict "$tmp/digits_bf16.onnx" --data "$m/digits_val_x.npy" --output "$tmp/digits_bf16_ours.npy"
# resnet: 8 SGD steps with BatchNorm, then training mode over one batch of 16.
"$bin" train "$m/resnet_op17.onnx" --data "$m/reference/resnet_op17/data.npy" \
    --labels "$m/reference/resnet_op17/labels.npy" --batch 8 --steps 8 --lr 0.05 \
    --momentum 0.9 --quiet --save "$tmp/resnet.onnx"
head_x="$tmp/resnet_x.npy"
"$py" -c "import numpy as np, sys; np.save(sys.argv[2], np.load(sys.argv[1])[:16])" \
    "$m/reference/resnet_op17/data.npy" "$head_x"
"$bin" predict "$tmp/resnet.onnx" --data "$head_x" --output "$tmp/resnet_ours.npy" --batch 16 --mode train

"$py" - "$tmp" "$m" <<'PY'
import sys
import numpy as np
import onnx
import onnxruntime as ort

tmp, models = sys.argv[1], sys.argv[2]

def inference_copy(path):
    """The saved training graph with BatchNorm in inference mode and Dropout
    as Identity: what evaluation mode computes."""
    model = onnx.load(path)
    nodes = []
    for n in model.graph.node:
        if n.op_type == "Dropout":
            n = onnx.helper.make_node("Identity", [n.input[0]], [n.output[0]], name=n.name)
        elif n.op_type == "BatchNormalization":
            for a in n.attribute:
                if a.name == "training_mode":
                    a.i = 0
            del n.output[1:]
        nodes.append(n)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    out = path.replace(".onnx", "_inference.onnx")
    onnx.save(model, out)
    return out

def check(model, x, ours, what):
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    ref = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    assert ref.shape == ours.shape, (what, ref.shape, ours.shape)
    err = np.abs(ref - ours).max() / max(1.0, np.abs(ref).max())
    print(f"{what}: {ours.shape[0]} samples, max difference {err:.2e} (relative to the largest output)")
    assert err < 1e-5, f"{what}: onnxruntime and gpipe-onnx differ by {err}"

x = np.load(f"{models}/digits_val_x.npy")
check(inference_copy(f"{tmp}/digits.onnx"), x, np.load(f"{tmp}/digits_ours.npy"), "digits, eval mode")
check(inference_copy(f"{tmp}/digits_bf16.onnx"), x, np.load(f"{tmp}/digits_bf16_ours.npy"),
      "digits trained in bf16, eval mode")
x = np.load(f"{tmp}/resnet_x.npy")
check(f"{tmp}/resnet.onnx", x, np.load(f"{tmp}/resnet_ours.npy"), "resnet, training mode")
PY
