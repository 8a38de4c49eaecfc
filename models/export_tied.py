"""Export the tied-weight fixture: a small GPT whose output head is its token
embedding (lm_head.weight is wte.weight, as GPT-2 and nanoGPT tie them), so
one initializer is read by the first layer (Gather) and by the head's
Transpose at the end of the layer list: a pipeline cut between them puts the
parameter in two stages.

Run with the interpreter that has torch 1.13 (see regenerate.sh):

    python3 export_tied.py [--out PATH]

Same recipe as export_fixtures.py (seeded construction, train() mode,
TrainingMode.TRAINING, no constant folding: folding would transpose the
head's weight into an initializer of its own and untie it), opset 17.
"""
import argparse
import os
import sys

import onnx
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixture_models as fm  # noqa: E402

VOCAB, BLOCK = 32, 8


class TiedGPT(fm.GPT):
    def __init__(self):
        super().__init__(vocab_size=VOCAB, block_size=BLOCK, n_layer=1, n_embd=16, n_head=2, dropout=0.1)
        self.lm_head.weight = self.wte.weight


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "data", "tied_gpt_op17.onnx"))
    args = ap.parse_args()
    torch.manual_seed(fm.SEED)
    model = TiedGPT()
    model.train()
    g = torch.Generator().manual_seed(1234)
    idx = torch.randint(0, VOCAB, (2, BLOCK), generator=g, dtype=torch.long)
    torch.onnx.export(model, (idx,), args.out, export_params=True, opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      input_names=["idx"], output_names=["logits"],
                      dynamic_axes={"idx": {0: "batch"}, "logits": {0: "batch"}})
    m = onnx.load(args.out)
    readers = [n.op_type for n in m.graph.node if "wte.weight" in n.input]
    assert len(m.graph.initializer) == len({i.name for i in m.graph.initializer})
    assert sorted(readers) == ["Gather", "Transpose"], f"the embedding is read by {readers}, not tied"
    print(f"torch {torch.__version__}: {args.out} ({os.path.getsize(args.out)} bytes), wte read by {readers}")


if __name__ == "__main__":
    main()
