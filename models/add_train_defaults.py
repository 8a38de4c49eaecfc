"""Writes a default training recipe into the digits models' metadata.

`gpipe-onnx train MODEL` with no data arguments reads these keys, so the
shipped default trains with nothing but the model's path. Paths are relative
to the model's folder (the trainer refuses anything outside it).

    python3 add_train_defaults.py
"""
import os

import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULTS = {
    "gpipe-onnx.data": "digits_train_x.npy",
    "gpipe-onnx.labels": "digits_train_y.npy",
    "gpipe-onnx.val_data": "digits_val_x.npy",
    "gpipe-onnx.val_labels": "digits_val_y.npy",
    "gpipe-onnx.epochs": "5",
    "gpipe-onnx.batch": "32",
    "gpipe-onnx.optimizer": "adamw",
    "gpipe-onnx.lr": "0.001",
}

for name in ("digits_cnn_op13.onnx", "digits_cnn_op17.onnx"):
    path = os.path.join(HERE, name)
    model = onnx.load(path)
    kept = [p for p in model.metadata_props if p.key not in DEFAULTS]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    for key, value in DEFAULTS.items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, path)
    print(f"{name}: training defaults written")
