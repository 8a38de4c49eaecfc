#!/usr/bin/env bash
# The command line: every fixture inspects with exit 0 and lists every layer;
# --json is valid JSON with the promised fields; bad input exits nonzero with
# a one-line reason; usage errors exit 2.
set -u
bin="$1"
root="${GP_SOURCE_ROOT:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# Python only checks the JSON; any python3 with the standard library will do.
py=$(command -v python3)

for model in "$root"/models/*.onnx; do
  name=$(basename "$model")
  if ! "$bin" inspect "$model" --batch 3 >"$tmp/out.txt" 2>"$tmp/err.txt"; then
    fail "inspect $name exited nonzero: $(cat "$tmp/err.txt")"
    continue
  fi
  grep -q "^inputs" "$tmp/out.txt" || fail "inspect $name printed no inputs"
  grep -q "^parameters" "$tmp/out.txt" || fail "inspect $name printed no parameter count"
  if ! "$bin" inspect "$model" --batch 3 --json >"$tmp/out.json" 2>"$tmp/err.txt"; then
    fail "inspect --json $name exited nonzero: $(cat "$tmp/err.txt")"
    continue
  fi
  # The table has one row per layer, numbered 0..n-1, and JSON agrees.
  rows=$(grep -cE '^ +[0-9]+  ' "$tmp/out.txt")
  "$py" - "$tmp/out.json" "$rows" "$name" <<'PY' || fail "inspect --json $name: wrong content"
import json, sys
doc = json.load(open(sys.argv[1]))
rows, name = int(sys.argv[2]), sys.argv[3]
layers = doc["layers"]
assert isinstance(doc["parameters"], int) and doc["parameters"] > 0, "parameters"
assert len(layers) == rows, f"{len(layers)} layers in JSON, {rows} rows in the table"
assert len(layers) + doc["folded_nodes"] + doc["fused_nodes"] == doc["source_nodes"], "node accounting"
for i, l in enumerate(layers):
    for key in ("index", "op", "name", "output_shapes", "params", "frontier_bytes"):
        assert key in l, f"layer {i} lacks {key}"
    assert l["index"] == i
    assert all(isinstance(s, list) and all(isinstance(d, int) and d >= 0 for d in s)
               for s in l["output_shapes"] if s is not None)
    assert l["frontier_bytes"] > 0
assert sum(l["params"] for l in layers) == doc["parameters"], "params column sums to the total"
for inp in doc["inputs"]:
    assert inp["shape"][0] == 3, "batch bound"
PY
done

# A tied parameter (the GPT whose head reads its embedding) is named with
# its readers; untied models have no such line.
"$bin" inspect "$root/tests/data/tied_gpt_op17.onnx" >"$tmp/out.txt" 2>&1 || fail "inspect of the tied GPT failed"
grep -q "^tied  *wte.weight read by layers 0, 31:" "$tmp/out.txt" || fail "inspect did not name the tied embedding"
# Split between its two readers, with micro-batches, the tied GPT trains one
# stage's bits (the head's weight Transpose stays a layer run once per step:
# absorbed into the MatMul, its terms would interleave with the embedding's).
tied=(train "$root/tests/data/tied_gpt_op17.onnx" --synthetic 48 --batch 12 --chunks 3 --steps 3 --momentum 0.9 --quiet)
"$bin" "${tied[@]}" --devices cpu:0 --save "$tmp/tied1.onnx" >/dev/null 2>&1 || fail "tied GPT on one stage failed"
"$bin" "${tied[@]}" --devices cpu:0,cpu:1 --balance 17,16 --save "$tmp/tied2.onnx" >/dev/null 2>&1 \
  || fail "tied GPT on two stages failed"
cmp -s "$tmp/tied1.onnx" "$tmp/tied2.onnx" || fail "the tied GPT split in two stages saved other bytes than one stage"
"$bin" inspect "$root/models/gpt_op17.onnx" | grep -q "^tied" && fail "inspect called the untied GPT tied"

# Each Linear's bias Add absorbed into its MatMul (graph/fuse.c): the table
# marks the layer, the JSON flags it; GP_FUSE_MATMUL_BIAS=0 keeps the Adds.
"$bin" inspect "$root/models/gpt_op17.onnx" | grep -q "MatMul\(([B]^T)\)\?+bias" \
  || fail "inspect showed no MatMul with a fused bias in the GPT"
"$bin" inspect "$root/models/gpt_op17.onnx" --json | grep -q '"fused_bias": *true' \
  || fail "inspect --json flagged no fused bias in the GPT"
GP_FUSE_MATMUL_BIAS=0 "$bin" inspect "$root/models/gpt_op17.onnx" | grep -q "+bias" \
  && fail "GP_FUSE_MATMUL_BIAS=0 still fused a bias"

expect_fail() { # expected-exit-code message-substring command...
  local code="$1" needle="$2"; shift 2
  "$@" >"$tmp/out.txt" 2>"$tmp/err.txt"
  local got=$?
  [ "$got" -eq "$code" ] || fail "'$*' exited $got, expected $code"
  grep -qF -- "$needle" "$tmp/err.txt" || fail "'$*' said '$(cat "$tmp/err.txt")', expected '$needle'"
  [ ! -s "$tmp/out.txt" ] || fail "'$*' wrote to stdout on failure"
}

head -c 5000 "$root/models/resnet_op17.onnx" >"$tmp/truncated.onnx"
expect_fail 1 "not a valid ONNX model" "$bin" inspect "$tmp/truncated.onnx"
[ "$(wc -l <"$tmp/err.txt")" -eq 1 ] || fail "the truncated-file error is not one line"
head -c 4096 /dev/urandom >"$tmp/random.onnx"
"$bin" inspect "$tmp/random.onnx" >/dev/null 2>"$tmp/err.txt"
[ $? -eq 1 ] || fail "random bytes did not exit 1"
expect_fail 1 "cannot open" "$bin" inspect "$tmp/none.onnx"
expect_fail 2 "no model given" "$bin" inspect
expect_fail 2 "unknown option '--bogus'" "$bin" inspect "$root/models/mlp_op13.onnx" --bogus
expect_fail 2 "--batch needs an integer" "$bin" inspect "$root/models/mlp_op13.onnx" --batch 0
expect_fail 2 "unknown command 'frobnicate'" "$bin" frobnicate
expect_fail 2 "--layout takes auto, nchw or nhwc, not 'bogus'" "$bin" inspect "$root/models/mlp_op13.onnx" --layout bogus

# inspect --layout nhwc runs the layout pass: a summary line with the count,
# the layers whose output is channels-last marked in the table and flagged
# in the JSON, the same ones both ways; without it (auto: nchw, inspect has
# no devices) nothing is flagged.
r="$root/models/resnet_op17.onnx"
"$bin" inspect "$r" --batch 2 --layout nhwc >"$tmp/layout.txt" 2>"$tmp/err.txt" \
  || fail "inspect --layout nhwc failed: $(cat "$tmp/err.txt")"
"$bin" inspect "$r" --batch 2 --layout nhwc --json >"$tmp/layout.json" 2>"$tmp/err.txt" \
  || fail "inspect --layout nhwc --json failed: $(cat "$tmp/err.txt")"
"$bin" inspect "$r" --batch 2 --json >"$tmp/nchw.json" 2>"$tmp/err.txt" || fail "inspect --json failed"
grep -qE "^layout +nhwc: [1-9][0-9]* activations channels-last" "$tmp/layout.txt" \
  || fail "inspect --layout nhwc printed no summary: $(grep -i layout "$tmp/layout.txt")"
grep -E '^ +[0-9]+  ' "$tmp/layout.txt" | awk '{ print $1, ($NF == "nhwc") ? 1 : 0 }' >"$tmp/marks.txt"
"$bin" inspect "$r" --batch 2 | grep -q "nhwc" && fail "inspect without --layout nhwc marks layers"
"$py" - "$tmp/layout.json" "$tmp/nchw.json" "$tmp/marks.txt" "$tmp/layout.txt" <<'PY' || fail "inspect --layout nhwc: table and JSON disagree"
import json, re, sys
nhwc, nchw = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
marks = [line.split() for line in open(sys.argv[3])]
summary = int(re.search(r"nhwc: (\d+) activations", open(sys.argv[4]).read()).group(1))
assert nhwc["layout"] == "nhwc" and nchw["layout"] == "nchw", (nhwc["layout"], nchw["layout"])
flags = [l["channels_last"] for l in nhwc["layers"]]
assert all(isinstance(f, bool) for f in flags)
assert nhwc["channels_last_activations"] == summary == sum(flags) > 0, (summary, sum(flags))
assert [int(m[1]) for m in marks] == [int(f) for f in flags], "the table marks other layers than the JSON"
assert nchw["channels_last_activations"] == 0 and not any(l["channels_last"] for l in nchw["layers"])
# Never the model's output, and the conv stem is.
assert not flags[-1] and flags[0]
PY
"$bin" inspect --help | grep -q -- "--layout" || fail "inspect --help lacks --layout"
# The fixture U-Net: why the layers that could write channels-last do not,
# as a list after the table and as each layer's layout_note in the JSON
# (the last Concat: its other input comes from a ConvTranspose, which reads
# and writes [N, C, H, W]); tagged layers have none.
u="$root/models/unet_op17.onnx"
"$bin" inspect "$u" --layout nhwc >"$tmp/unet.txt" 2>"$tmp/err.txt" || fail "inspect unet --layout nhwc failed"
"$bin" inspect "$u" --layout nhwc --json >"$tmp/unet.json" 2>"$tmp/err.txt" || fail "inspect unet --json failed"
grep -q '^stays \[N, C, H, W\]:' "$tmp/unet.txt" || fail "inspect --layout nhwc lists no layer staying [N, C, H, W]"
grep -q "^  #18 Concat '/Concat_1': its input '/up1/ConvTranspose_output_0' is \[N, C, H, W\]" "$tmp/unet.txt" \
  || fail "inspect --layout nhwc: no reason for the Concat: $(grep '#18' "$tmp/unet.txt")"
"$py" - "$tmp/unet.json" <<'PY' || fail "inspect --layout nhwc --json: layout notes wrong"
import json, sys
layers = json.load(open(sys.argv[1]))["layers"]
assert "ConvTranspose" in layers[18]["layout_note"], layers[18]
assert "graph output" in layers[22]["layout_note"], layers[22]
assert all("layout_note" not in l for l in layers if l["channels_last"])
PY

# train: bad input is refused with a reason before any work.
m="$root/models"
expect_fail 2 "no model given" "$bin" train
expect_fail 2 "--optimizer is sgd or adamw" "$bin" train "$m/mlp_op17.onnx" --synthetic --optimizer lbfgs
expect_fail 2 "labels given without their data" "$bin" train "$m/mlp_op17.onnx" --labels "$m/digits_train_y.npy"
expect_fail 2 "no training data" "$bin" train "$m/mlp_op17.onnx"
expect_fail 1 "the data has shape [1437, 1, 8, 8] but the model input 'input' takes [N, 32]" \
  "$bin" train "$m/mlp_op17.onnx" --data "$m/digits_train_x.npy" --labels "$m/digits_train_y.npy"
expect_fail 1 "cannot be split into 3 equal micro-batches" \
  "$bin" train "$m/mlp_op17.onnx" --synthetic 64 --batch 16 --chunks 3
expect_fail 1 "fewer than one batch" "$bin" train "$m/mlp_op17.onnx" --synthetic 10 --batch 16
expect_fail 1 "labels have 360 rows but the data has 1437" \
  "$bin" train "$m/digits_cnn_op17.onnx" --data "$m/digits_train_x.npy" --labels "$m/digits_val_y.npy"
expect_fail 1 "cannot open" "$bin" train "$m/mlp_op17.onnx" --data "$tmp/missing.npy"

# GP_MEMORY_VERBOSE=1: each stage's memory account, block by block, on
# stderr; on 2 stages, stage 0's gradient set shares its arena's block and
# stage 1's does not (pipeline/plan.h). GP_SCRATCH_IN_SETS=0 keeps the
# kernel workspaces in a block of their own (here they fit in the sets'
# dead bytes), so that the account names the layer it is sized for.
GP_SCRATCH_IN_SETS=0 GP_MEMORY_VERBOSE=1 "$bin" train "$m/digits_cnn_op17.onnx" --synthetic 32 --batch 16 --steps 1 --devices cpu:0,cpu:1 \
  >/dev/null 2>"$tmp/memory.txt" || fail "train with GP_MEMORY_VERBOSE=1 failed: $(cat "$tmp/memory.txt")"
grep -q "^memory: stage 0 (layers 0-.*activation gradients (one block)" "$tmp/memory.txt" ||
  fail "GP_MEMORY_VERBOSE: no stage 0 account with its shared block: $(cat "$tmp/memory.txt")"
grep "^memory: stage 1 " "$tmp/memory.txt" | grep -q ", activation gradients [0-9.]* MiB" ||
  fail "GP_MEMORY_VERBOSE: no stage 1 account with its own gradient block: $(cat "$tmp/memory.txt")"
grep -q "^memory: stage 0: its kernel workspace, [0-9.]* MiB, is layer [0-9]*'s ('.*', Conv)" "$tmp/memory.txt" ||
  fail "GP_MEMORY_VERBOSE: no layer named for stage 0's kernel workspace: $(cat "$tmp/memory.txt")"

# train --recompute-norm always|auto|never: the saved model byte for byte
# the one kept outputs train (BatchNorm outputs written again in the
# backward), a note says how many and what it saved; auto (the default)
# remakes nothing where the stage fits, and on a device with less free
# memory than the kept plan takes (GP_CPU_MEMORY_AVAILABLE, between the
# two plans) plans again with them remade and says so, where never refuses
# with the stage's account; a bad value is a usage error.
"$bin" train --help | grep -q -- "--recompute-norm always|auto|never" || fail "train --help lacks --recompute-norm"
expect_fail 2 "--recompute-norm is always, auto or never (got 'sometimes')" \
  "$bin" train "$m/resnet_op17.onnx" --synthetic --recompute-norm sometimes
for r in never always auto; do
  "$bin" train "$m/resnet_op17.onnx" --synthetic 16 --batch 8 --steps 2 --momentum 0.9 --save "$tmp/resnet_$r.onnx" \
    --recompute-norm $r --metrics "$tmp/recompute_$r.jsonl" >"$tmp/recompute_$r.txt" 2>&1 ||
    fail "train --recompute-norm $r failed: $(cat "$tmp/recompute_$r.txt")"
  cmp -s "$tmp/resnet_never.onnx" "$tmp/resnet_$r.onnx" || fail "--recompute-norm $r changed the trained model"
done
remade_note="note: --recompute-norm: [0-9]+ BatchNormalization outputs? written again in the backward instead of kept"
grep -qE "$remade_note: [0-9.]+ MiB of activations less" "$tmp/recompute_always.txt" ||
  fail "--recompute-norm always: no note of what it remade: $(cat "$tmp/recompute_always.txt")"
! grep -q "note: --recompute-norm" "$tmp/recompute_auto.txt" "$tmp/recompute_never.txt" ||
  fail "--recompute-norm auto or never remade outputs on a stage that fits"
planned() { "$py" -c 'import json, sys
print([json.loads(l)["memory"]["planned_bytes"] for l in open(sys.argv[1]) if "memory" in l][0])' "$1"; }
kept=$(planned "$tmp/recompute_never.jsonl") remade=$(planned "$tmp/recompute_always.jsonl")
[ "$remade" -lt "$kept" ] || fail "--recompute-norm always planned $remade bytes, never $kept"
limit=$(( (kept + remade) / 2 ))
GP_CPU_MEMORY_AVAILABLE=$limit "$bin" train "$m/resnet_op17.onnx" --synthetic 16 --batch 8 --steps 2 --momentum 0.9 \
  --save "$tmp/resnet_short.onnx" >"$tmp/recompute_short.txt" 2>&1 ||
  fail "train --recompute-norm auto on a short device failed: $(cat "$tmp/recompute_short.txt")"
auto_note="$remade_note: [0-9.]+ MiB of activations less \(auto: a stage did not fit with them kept; the fewest that fit"
grep -qE "$auto_note" "$tmp/recompute_short.txt" ||
  fail "--recompute-norm auto: no note on a short device: $(cat "$tmp/recompute_short.txt")"
cmp -s "$tmp/resnet_never.onnx" "$tmp/resnet_short.onnx" || fail "--recompute-norm auto changed the trained model"
# auto remakes only as many as the stage needs, the largest first: one
# byte short of the kept plan, fewer than always does; the same model
# (--memory-limit in bytes: the cap on what the device reports free).
"$bin" train "$m/resnet_op17.onnx" --synthetic 16 --batch 8 --steps 2 --memory-limit $((kept - 1)) \
  --momentum 0.9 --save "$tmp/resnet_short1.onnx" --metrics "$tmp/recompute_short1.jsonl" >"$tmp/recompute_short1.txt" 2>&1 ||
  fail "train --recompute-norm auto one byte short failed: $(cat "$tmp/recompute_short1.txt")"
remade_count() { grep -oE "recompute-norm: [0-9]+ " "$1" | grep -oE "[0-9]+"; }
n_all=$(remade_count "$tmp/recompute_always.txt") n_one=$(remade_count "$tmp/recompute_short1.txt")
[ -n "$n_one" ] && [ "$n_one" -lt "$n_all" ] ||
  fail "--recompute-norm auto one byte short remade '$n_one' outputs, always $n_all: $(cat "$tmp/recompute_short1.txt")"
[ "$(planned "$tmp/recompute_short1.jsonl")" -lt "$kept" ] || fail "--recompute-norm auto one byte short did not fit"
cmp -s "$tmp/resnet_never.onnx" "$tmp/resnet_short1.onnx" || fail "--recompute-norm auto (one byte short) changed the model"
GP_CPU_MEMORY_AVAILABLE=$limit expect_fail 1 "but only" "$bin" train "$m/resnet_op17.onnx" --synthetic 16 --batch 8 \
  --steps 2 --momentum 0.9 --recompute-norm never
# The first stage's buffer of the next step's inputs (uploaded during the
# step, by default) is given up before a stage is refused: one byte short
# with never, it trains without it, says so, and the model is the same.
"$bin" train "$m/resnet_op17.onnx" --synthetic 16 --batch 8 --steps 2 --momentum 0.9 --recompute-norm never \
  --memory-limit $((kept - 1)) --save "$tmp/resnet_noahead.onnx" >"$tmp/noahead.txt" 2>&1 ||
  fail "train one byte short without remaking failed: $(cat "$tmp/noahead.txt")"
grep -qE "note: the first stage had no room for the next step's inputs \([0-9.]+ KiB\)" "$tmp/noahead.txt" ||
  fail "one byte short without remaking: no note of the uploads given up: $(cat "$tmp/noahead.txt")"
cmp -s "$tmp/resnet_never.onnx" "$tmp/resnet_noahead.onnx" || fail "giving up the uploads ahead changed the model"
! grep -q "no room for the next step" "$tmp/recompute_short1.txt" ||
  fail "auto one byte short gave up the uploads ahead where remaking fits"
# train --memory-limit SIZE: the same as a device with that much free (a
# size with K, M, G: powers of 1024); below what the stage needs at the
# least, refused with the account; a size that is none is a usage error.
"$bin" train "$m/resnet_op17.onnx" --synthetic 16 --batch 8 --steps 2 --momentum 0.9 --memory-limit "$limit" \
  --save "$tmp/resnet_limit.onnx" >"$tmp/limit.txt" 2>&1 || fail "train --memory-limit $limit failed: $(cat "$tmp/limit.txt")"
grep -qE "$auto_note" "$tmp/limit.txt" || fail "--memory-limit $limit: no note of what auto remade: $(cat "$tmp/limit.txt")"
cmp -s "$tmp/resnet_never.onnx" "$tmp/resnet_limit.onnx" || fail "--memory-limit changed the trained model"
"$bin" train "$m/resnet_op17.onnx" --synthetic 16 --batch 8 --steps 2 --memory-limit 1G --save "$tmp/resnet_1g.onnx" \
  >"$tmp/limit1g.txt" 2>&1 || fail "train --memory-limit 1G failed: $(cat "$tmp/limit1g.txt")"
! grep -q "note: --recompute-norm" "$tmp/limit1g.txt" || fail "--memory-limit 1G remade outputs on a stage that fits"
expect_fail 1 "MiB are allowed (--memory-limit)" "$bin" train "$m/resnet_op17.onnx" --synthetic 16 --batch 8 --steps 2 \
  --memory-limit 0.5M
for bad in 5.4X 0 -1 1Gb ""; do
  expect_fail 2 "--memory-limit takes a size such as 5.4G" "$bin" train "$m/resnet_op17.onnx" --synthetic --memory-limit "$bad"
done
"$bin" train --help | grep -q -- "--memory-limit SIZE" || fail "train --help lacks --memory-limit"

# train --layout: a bad name is a usage error; on CPU devices nhwc trains
# through [N, C, H, W] copies to the bits of nchw (saved models byte for
# byte: on a 2-stage pipeline recomputing every micro-batch in bf16, and on
# one device in fp32), says what it stored channels-last, and predict
# --layout nhwc gives nchw's outputs; auto there is nchw, without a note.
expect_fail 2 "--layout takes auto, nchw or nhwc, not 'bogus'" "$bin" train "$m/digits_cnn_op17.onnx" --synthetic --layout bogus
expect_fail 2 "--layout takes auto, nchw or nhwc, not ''" "$bin" train "$m/digits_cnn_op17.onnx" --synthetic --layout
"$bin" train --help | grep -q -- "--layout auto|nchw|nhwc" || fail "train --help lacks --layout"
for l in nchw nhwc auto; do
  "$bin" train "$m/resnet_op17.onnx" --synthetic 24 --batch 8 --chunks 2 --steps 3 --devices cpu:0,cpu:1 \
    --checkpoint always --precision bf16 --layout $l --save "$tmp/resnet_$l.onnx" >/dev/null 2>"$tmp/layout_$l.txt" \
    || fail "train --layout $l failed: $(cat "$tmp/layout_$l.txt")"
  "$bin" train "$m/digits_cnn_op17.onnx" --synthetic 24 --batch 8 --steps 3 --devices cpu:0 \
    --layout $l --save "$tmp/digits_$l.onnx" >/dev/null 2>>"$tmp/layout_$l.txt" \
    || fail "train --layout $l failed: $(cat "$tmp/layout_$l.txt")"
done
cmp -s "$tmp/resnet_nchw.onnx" "$tmp/resnet_nhwc.onnx" || fail "resnet: --layout nhwc trained other weights than nchw"
cmp -s "$tmp/digits_nchw.onnx" "$tmp/digits_nhwc.onnx" || fail "digits_cnn: --layout nhwc trained other weights than nchw"
cmp -s "$tmp/resnet_nchw.onnx" "$tmp/resnet_auto.onnx" || fail "resnet: --layout auto trained other weights than nchw"
grep -qE "note: [1-9][0-9]* activations stored channels-last" "$tmp/layout_nhwc.txt" \
  || fail "train --layout nhwc said nothing of channels-last: $(cat "$tmp/layout_nhwc.txt")"
grep -q "channels-last" "$tmp/layout_nchw.txt" "$tmp/layout_auto.txt" && fail "train --layout nchw or auto on CPUs noted channels-last"
for l in nchw nhwc; do
  "$bin" predict "$tmp/digits_nchw.onnx" --data "$m/digits_val_x.npy" --output "$tmp/pred_$l.npy" --batch 32 \
    --layout $l 2>"$tmp/err.txt" >/dev/null || fail "predict --layout $l failed: $(cat "$tmp/err.txt")"
done
cmp -s "$tmp/pred_nchw.npy" "$tmp/pred_nhwc.npy" || fail "predict --layout nhwc gave other outputs than nchw"

# train: synthetic data, metrics and the saved model; the metrics file has
# one line per step with a finite loss, and the saved model inspects.
"$bin" train "$m/gpt_op17.onnx" --synthetic 32 --batch 8 --chunks 2 --steps 4 --optimizer adamw \
  --metrics "$tmp/metrics.jsonl" --save "$tmp/gpt_trained.onnx" --quiet >/dev/null 2>"$tmp/err.txt" \
  || fail "synthetic gpt training failed: $(cat "$tmp/err.txt")"
[ "$(grep -c '"loss"' "$tmp/metrics.jsonl" 2>/dev/null)" -eq 4 ] || fail "metrics lack 4 step lines"
! ls "$tmp"/metrics.jsonl.tmp* >/dev/null 2>&1 || fail "the metrics temporary file was left behind"
"$bin" inspect "$tmp/gpt_trained.onnx" >/dev/null || fail "the saved model does not load"
# The attention fusion: inspect shows nanoGPT's attention as one Attention
# layer reading the packed Q, K, V (13 nodes and the Split into 1), and as
# the exported chain with --no-fuse-attention;
# training either way gives the same losses within float32 rounding.
a="$root/tests/data/attention/nanogpt_op17.onnx"
"$bin" inspect "$a" --batch 2 --json >"$tmp/fused.json" 2>"$tmp/err.txt" || fail "inspect nanogpt: $(cat "$tmp/err.txt")"
"$bin" inspect "$a" --batch 2 --json --no-fuse-attention >"$tmp/unfused.json" 2>"$tmp/err.txt" \
  || fail "inspect --no-fuse-attention nanogpt: $(cat "$tmp/err.txt")"
"$bin" inspect "$a" --batch 2 | grep -q "^ *1  Attention(QKV) " || fail "inspect shows no packed Attention layer"
for f in fused unfused; do
  flag=; [ $f = unfused ] && flag=--no-fuse-attention
  "$bin" train "$a" --synthetic 16 --batch 4 --chunks 2 --steps 3 $flag --metrics "$tmp/$f.jsonl" --quiet \
    >/dev/null 2>"$tmp/err.txt" || fail "training nanogpt ($f) failed: $(cat "$tmp/err.txt")"
done
"$py" - "$tmp" <<'PY' || fail "attention fusion: inspect or training differ from the unfused model"
import json, sys
t = sys.argv[1]
f, u = (json.load(open(f"{t}/{n}.json")) for n in ("fused", "unfused"))
ops = lambda d: [l["op"] for l in d["layers"]]
assert ops(f).count("Attention") == 1 and "Softmax" not in ops(f), ops(f)
assert "Attention" not in ops(u) and "Softmax" in ops(u), ops(u)
assert len(ops(u)) - len(ops(f)) == 13 and f["fused_nodes"] - u["fused_nodes"] == 13
assert [l.get("packed_qkv", False) for l in f["layers"] if l["op"] == "Attention"] == [True], f["layers"]
lf, lu = ([json.loads(l)["loss"] for l in open(f"{t}/{n}.jsonl") if "\"loss\"" in l] for n in ("fused", "unfused"))
assert len(lf) == 3 and all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(lf, lu)), (lf, lu)
PY
# Validation lines go to stdout, with accuracy for classifiers.
"$bin" train "$m/digits_cnn_op17.onnx" --data "$m/digits_train_x.npy" --labels "$m/digits_train_y.npy" \
  --val-data "$m/digits_val_x.npy" --val-labels "$m/digits_val_y.npy" --steps 5 --quiet >"$tmp/out.txt" \
  || fail "digits training failed"
grep -q "^epoch 1: train loss .* val accuracy" "$tmp/out.txt" || fail "no validation line: $(cat "$tmp/out.txt")"
# Outputs are checked before training, data for non-finite values: each is
# refused at once with what is wrong, and nothing is reported saved.
expect_fail 1 "cannot create a file next to '/proc/nope/x.onnx'" \
  "$bin" train "$m/digits_cnn_op17.onnx" --save /proc/nope/x.onnx
expect_fail 1 "it is a folder" "$bin" train "$m/mlp_op17.onnx" --synthetic 16 --batch 8 --steps 1 --trace "$tmp"
expect_fail 1 "cannot create a file next to" \
  "$bin" train "$m/mlp_op17.onnx" --synthetic 16 --batch 8 --steps 1 --metrics /proc/nope/m.jsonl
expect_fail 1 "cannot create a file next to" \
  "$bin" train "$m/mlp_op17.onnx" --synthetic 16 --batch 8 --steps 1 --algorithms /proc/nope/a.txt
# --algorithms: a file of another backend's choices is a note, never a failure;
# on CPU devices nothing is measured and nothing written.
printf 'cuda cudnn 1 device another GPU\nconv 1 2 3\n' > "$tmp/algorithms.txt"
"$bin" train "$m/mlp_op17.onnx" --synthetic 16 --batch 8 --steps 1 --devices cpu:0 \
  --algorithms "$tmp/algorithms.txt" >/dev/null 2>"$tmp/alg.txt" || fail "--algorithms with another GPU's choices: $(cat "$tmp/alg.txt")"
grep -q "not bit for bit" "$tmp/alg.txt" || fail "no note about the foreign choices: $(cat "$tmp/alg.txt")"
"$bin" train "$m/digits_cnn_op17.onnx" --save /proc/nope/x.onnx 2>&1 | grep -q "^step\|^saved" \
  && fail "an unwritable --save trained or said saved"
"$py" - "$tmp/nan_x.npy" "$tmp/nan_y.npy" "$tmp/empty_x.npy" "$tmp/empty_y.npy" <<'PY'
import struct, sys
def save(path, fmt, descr, values, shape):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack("<%d%s" % (len(values), fmt), *values))
x = [0.5] * (16 * 32)
x[5 * 32 + 26] = float("nan")
save(sys.argv[1], "f", "<f4", x, "(16, 32)")
save(sys.argv[2], "q", "<i8", [0] * 16, "(16,)")
save(sys.argv[3], "f", "<f4", [], "(0, 1, 8, 8)")
save(sys.argv[4], "q", "<i8", [], "(0,)")
PY
expect_fail 1 "nan_x.npy: sample 5 holds NaN (element 26 of the sample)" \
  "$bin" train "$m/mlp_op17.onnx" --data "$tmp/nan_x.npy" --labels "$tmp/nan_y.npy" --batch 8 --steps 1
# An empty validation set is refused, not evaluated to a loss of 0.
expect_fail 1 "the validation data has no samples" "$bin" train "$m/digits_cnn_op17.onnx" --data "$m/digits_train_x.npy" \
  --labels "$m/digits_train_y.npy" --val-data "$tmp/empty_x.npy" --val-labels "$tmp/empty_y.npy" --batch 8 --steps 1
# A failed run writes no model.
"$bin" train "$m/mlp_op17.onnx" --synthetic 8 --batch 8 --lr 1e30 --steps 3 --save "$tmp/diverged.onnx" \
  --quiet >/dev/null 2>&1
[ ! -e "$tmp/diverged.onnx" ] || fail "a diverged run left a saved model"
"$bin" train --help | grep -q -- "--no-shuffle" || fail "train --help lacks --no-shuffle"

# train --pipeline-schedule (--schedule stays the learning rate's): 1f1b
# trains, says so in its report and its trace, and gives gpipe's weights
# byte for byte; a bad name is refused.
expect_fail 2 "--pipeline-schedule is gpipe or 1f1b (got 'pipedream')" \
  "$bin" train "$m/mlp_op17.onnx" --synthetic --pipeline-schedule pipedream
for s in gpipe 1f1b; do
  "$bin" train "$m/mlp_op17.onnx" --synthetic 32 --batch 8 --chunks 4 --steps 2 --devices cpu:0,cpu:1,cpu:2 \
    --pipeline-schedule $s --schedule cosine --save "$tmp/mlp_$s.onnx" --trace "$tmp/trace_$s.json" \
    >/dev/null 2>"$tmp/err_$s.txt" || fail "train --pipeline-schedule $s failed: $(cat "$tmp/err_$s.txt")"
done
grep -q "3 stages, 1f1b schedule, checkpoint except_last" "$tmp/err_1f1b.txt" \
  || fail "train's report does not name the 1f1b schedule: $(head -1 "$tmp/err_1f1b.txt")"
cmp -s "$tmp/mlp_gpipe.onnx" "$tmp/mlp_1f1b.onnx" || fail "1f1b trained other weights than gpipe"
"$py" - "$tmp/trace_1f1b.json" <<'PY' || fail "the 1f1b trace does not name its schedule"
import json, sys
d = json.load(open(sys.argv[1]))["otherData"]
assert d["pipeline_schedule"] == "1f1b" and d["stages"] == 3 and d["micro_batches"] == 4, d
PY

# balance: the report, its JSON, and a saved profile that reproduces it.
"$bin" balance "$m/unet_op17.onnx" --devices cpu:0,cpu:1,cpu:2 --batch 8 --chunks 4 \
  --json "$tmp/balance.json" --profile-out "$tmp/profile.json" >"$tmp/out.txt" 2>"$tmp/err.txt" \
  || fail "balance failed: $(cat "$tmp/err.txt")"
grep -q "^optimal" "$tmp/out.txt" || fail "balance printed no optimal split"
grep -q "^even" "$tmp/out.txt" || fail "balance printed no even split"
grep -q "^heuristic" "$tmp/out.txt" || fail "balance printed no heuristic split"
grep -q "bubble" "$tmp/out.txt" || fail "balance printed no bubble"
grep -qE "^time by op: [A-Za-z]+ x[0-9]+ [0-9.]+% " "$tmp/out.txt" || fail "balance printed no time by op"
"$py" - "$tmp/balance.json" <<'PY' || fail "balance JSON lacks fields"
import json, sys
d = json.load(open(sys.argv[1]))
st = d["stages"]
assert len(st) == 3 and st[0]["first_layer"] == 0
for a, b in zip(st, st[1:]):
    assert b["first_layer"] == a["last_layer"] + 1
for s in st:
    assert s["time_ms"] > 0 and s["memory_bytes"] > 0
assert d["predicted_step_ms"] > 0 and sum(d["balance"]) == st[-1]["last_layer"] + 1
PY
"$bin" balance "$m/unet_op17.onnx" --devices cpu:0,cpu:1,cpu:2 --batch 8 --chunks 4 \
  --profile-in "$tmp/profile.json" --json "$tmp/balance2.json" >/dev/null 2>&1 || fail "balance --profile-in failed"
cmp -s "$tmp/balance.json" "$tmp/balance2.json" || fail "a saved profile does not reproduce its balance"
# balance --svg: the picture agrees with the JSON report: a bar per layer
# (titled with the layer's index, name and op), a cut line per stage boundary
# at the stage's first layer, each stage's load as the report has it.
"$bin" inspect "$m/unet_op17.onnx" --batch 2 --json >"$tmp/inspect.json" 2>/dev/null || fail "inspect unet failed"
for by in time memory; do
  "$bin" balance "$m/unet_op17.onnx" --devices cpu:0,cpu:1,cpu:2 --batch 8 --chunks 4 --by $by \
    --profile-in "$tmp/profile.json" --json "$tmp/balance_$by.json" --svg "$tmp/balance_$by.svg" >/dev/null \
    2>"$tmp/err.txt" || fail "balance --svg --by $by failed: $(cat "$tmp/err.txt")"
  "$py" - "$tmp/balance_$by.svg" "$tmp/balance_$by.json" "$tmp/inspect.json" "$by" <<'PY' || fail "balance --svg --by $by: the picture disagrees with the report"
import json, sys
import xml.etree.ElementTree as ET
ns = "{http://www.w3.org/2000/svg}"
root = ET.parse(sys.argv[1]).getroot()
rep, layers, by = json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))["layers"], sys.argv[4]
stages = rep["stages"]
n = stages[-1]["last_layer"] + 1
groups = [g for g in root.iter(ns + "g")]
bars = [g for g in groups if g.get("class") == "layer"]
assert len(bars) == n == len(layers), f"{len(bars)} bars for {n} layers"
for i, g in enumerate(bars):
    assert int(g.get("data-layer")) == i
    title = g.find(ns + "title").text
    assert title.startswith(f"layer {i} {layers[i]['name']} ({layers[i]['op']})"), title
    assert len(g.findall(ns + "rect")) == 2, "forward and backward"
    assert float(g.get("data-forward-ms")) >= 0 and float(g.get("data-backward-ms")) >= 0
cuts = [l for l in root.iter(ns + "line") if l.get("class") == "cut" and l.get("data-cut")]
assert len(cuts) == len(stages) - 1, f"{len(cuts)} cuts for {len(stages)} stages"
assert [int(c.get("data-cut")) for c in cuts] == [s["first_layer"] for s in stages[1:]]
drawn = [g for g in groups if g.get("class") == "stage"]
assert len(drawn) == len(stages)
key = "time_ms" if by == "time" else "memory_bytes"
slowest = max(s[key] for s in stages)
for g, s in zip(drawn, stages):
    assert int(g.get("data-first-layer")) == s["first_layer"] and int(g.get("data-last-layer")) == s["last_layer"]
    assert abs(float(g.get("data-time-ms")) - s["time_ms"]) <= 1e-6 * max(1, s["time_ms"]), (g.get("data-time-ms"), s)
    assert int(g.get("data-memory-bytes")) == s["memory_bytes"]
    assert abs(float(g.get("data-share")) - s[key] / slowest) <= 1e-6
assert max(float(g.get("data-share")) for g in drawn) == 1.0
PY
done
# An output that cannot be written is refused before the profiling, and
# nothing is left behind.
expect_fail 1 "nowhere/balance.svg" \
  "$bin" balance "$m/unet_op17.onnx" --devices cpu:0,cpu:1 --svg "$tmp/nowhere/balance.svg"
[ -e "$tmp/nowhere" ] && fail "balance --svg made the missing folder"
# The balancer counts what the 1f1b schedule holds: named in the report,
# its JSON and the command it suggests.
"$bin" balance "$m/unet_op17.onnx" --devices cpu:0,cpu:1,cpu:2 --batch 8 --chunks 4 --by memory \
  --pipeline-schedule 1f1b --profile-in "$tmp/profile.json" --json "$tmp/balance_1f1b.json" >"$tmp/out.txt" 2>&1 \
  || fail "balance --pipeline-schedule 1f1b failed: $(cat "$tmp/out.txt")"
grep -q "^balance by memory: 3 stages, batch 8 in 4 micro-batches, 1f1b schedule" "$tmp/out.txt" \
  || fail "balance's report does not name the 1f1b schedule"
grep -q "^train with: .* --pipeline-schedule 1f1b --balance " "$tmp/out.txt" || fail "balance suggests no 1f1b run"
"$py" -c 'import json, sys; assert json.load(open(sys.argv[1]))["pipeline_schedule"] == "1f1b"' \
  "$tmp/balance_1f1b.json" || fail "balance JSON does not name the 1f1b schedule"
# --fast-conv: a saved profile records it; a CPU profile serves it on the
# CPU (its convolutions have one algorithm) and the suggested command
# carries it; a GPU split refuses a profile timed without it (in a build
# with the CUDA backend; without one, the GPU itself is refused first).
"$py" -c 'import json, sys; assert json.load(open(sys.argv[1]))["fast_conv"] is False' "$tmp/profile.json" \
  || fail "a saved profile does not record --fast-conv"
"$bin" balance "$m/unet_op17.onnx" --devices cpu:0,cpu:1,cpu:2 --batch 8 --chunks 4 --fast-conv \
  --profile-in "$tmp/profile.json" >"$tmp/out.txt" 2>&1 || fail "balance --fast-conv failed: $(cat "$tmp/out.txt")"
grep -q "^train with: .* --fast-conv --balance " "$tmp/out.txt" || fail "balance --fast-conv suggests no --fast-conv run"
"$bin" balance "$m/unet_op17.onnx" --devices cuda:0,cuda:1 --batch 8 --chunks 4 --fast-conv \
  --profile-in "$tmp/profile.json" >"$tmp/out.txt" 2>"$tmp/err.txt"
[ $? -eq 1 ] || fail "a GPU split took a profile timed without --fast-conv"
grep -qE "was profiled without --fast-conv: profile again with it|this build has no CUDA backend" "$tmp/err.txt" \
  || fail "a GPU split with --fast-conv and a profile without it: $(cat "$tmp/err.txt")"
# A GPU asked for where none is usable: one line that says so and how to
# train on the CPU (or, without the CUDA backend, that the build has none).
if "$bin" devices 2>/dev/null | grep -q "no GPU visible"; then
  expect_fail 1 "" "$bin" train "$m/mlp_op17.onnx" --synthetic 16 --batch 8 --steps 1 --devices cuda:0
  grep -qE "no GPU is usable on this machine .*--devices cpu:0|this build has no CUDA backend" "$tmp/err.txt" \
    || fail "train --devices cuda:0 without a GPU: $(cat "$tmp/err.txt")"
fi
# --recompute-norm always: the remade BatchNorm outputs leave the stages'
# memory (test_balance checks the count against the plan's), and the
# suggested command carries it.
for r in never always; do
  "$bin" balance "$m/resnet_op17.onnx" --devices cpu:0,cpu:1 --batch 8 --chunks 4 --by memory --repeats 1 \
    --recompute-norm $r --json "$tmp/balance_$r.json" >"$tmp/out_$r.txt" 2>&1 \
    || fail "balance --recompute-norm $r failed: $(cat "$tmp/out_$r.txt")"
done
grep -q "^train with: .* --recompute-norm always --balance " "$tmp/out_always.txt" \
  || fail "balance --recompute-norm always suggests a run without it"
grep -q "^balance by memory: .*, BatchNorm outputs remade$" "$tmp/out_always.txt" \
  || fail "balance --recompute-norm always: the report does not say so"
grep -q "recompute-norm" "$tmp/out_never.txt" && fail "balance --recompute-norm never suggests remaking"
"$py" -c 'import json, sys
mem = [sum(s["memory_bytes"] for s in json.load(open(f))["stages"]) for f in sys.argv[1:]]
assert mem[1] < mem[0], mem' "$tmp/balance_never.json" "$tmp/balance_always.json" \
  || fail "balance --recompute-norm always counts no less memory than never"
expect_fail 2 "--recompute-norm is always or never" \
  "$bin" balance "$m/resnet_op17.onnx" --devices cpu:0 --recompute-norm auto
expect_fail 2 "--pipeline-schedule is gpipe or 1f1b (got 'fast')" \
  "$bin" balance "$m/unet_op17.onnx" --devices cpu:0 --pipeline-schedule fast
expect_fail 2 "--devices is required" "$bin" balance "$m/unet_op17.onnx"
expect_fail 2 "--by is time or memory" "$bin" balance "$m/unet_op17.onnx" --devices cpu:0 --by speed
expect_fail 1 "profiles 23 layers but the model has" \
  "$bin" balance "$m/gpt_op17.onnx" --devices cpu:0,cpu:1 --profile-in "$tmp/profile.json"
"$bin" train "$m/unet_op17.onnx" --synthetic 32 --batch 8 --chunks 4 --devices cpu:0,cpu:1 \
  --balance time --steps 2 >"$tmp/out.txt" 2>"$tmp/err.txt" || fail "train --balance time failed: $(cat "$tmp/err.txt")"
grep -q "^optimal" "$tmp/out.txt" || fail "train --balance time printed no report"

# Token ids outside the embedding table are refused before training, naming
# the sample (written as .npy with the standard library only).
"$py" - "$tmp/tokens.npy" "$tmp/next.npy" <<'PY'
import struct, sys
def save(path, values, shape):
    header = "{'descr': '<i8', 'fortran_order': False, 'shape': (%d, %d), }" % shape
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack("<%dq" % len(values), *values))
tokens = [3] * 128
tokens[5 * 16 + 7] = 99999
save(sys.argv[1], tokens, (8, 16))
save(sys.argv[2], [0] * 128, (8, 16))
PY
expect_fail 1 "index 99999 in sample 5 (position 7)" \
  "$bin" train "$m/gpt_op17.onnx" --data "$tmp/tokens.npy" --labels "$tmp/next.npy" --batch 2 --steps 1 --devices cpu:0

# The main command (the shipped default: 5 epochs of the digits) in bf16
# reaches the fp32 run's accuracy within one point; predict takes the
# precision too; a bad precision is a usage error.
expect_fail 2 "--precision takes fp32, tf32 or bf16" "$bin" train "$m/mlp_op17.onnx" --synthetic --precision fp16
# (Under the sanitizers one epoch of bf16 only: the accuracy run is the plain build's.)
if [ "${GP_SANITIZED:-0}" = 1 ]; then
  "$bin" train "$m/digits_cnn_op17.onnx" --devices cpu:0 --precision bf16 --epochs 1 --quiet \
    --save "$tmp/digits_bf16.onnx" >/dev/null 2>&1 || fail "one epoch in bf16 failed"
else
  for p in fp32 bf16; do
    "$bin" train "$m/digits_cnn_op17.onnx" --devices cpu:0 --precision $p --quiet --save "$tmp/digits_$p.onnx" \
      >"$tmp/main_$p.txt" 2>&1 || fail "main command in $p failed: $(tail -3 "$tmp/main_$p.txt")"
  done
  acc() { grep "^epoch 5:" "$1" | sed 's/.*val accuracy \([0-9.]*\)%.*/\1/'; }
  a32=$(acc "$tmp/main_fp32.txt"); a16=$(acc "$tmp/main_bf16.txt")
  echo "main command: fp32 ${a32}%, bf16 ${a16}% validation accuracy"
  awk -v a="$a32" -v b="$a16" 'BEGIN { exit !(a != "" && b != "" && b >= a - 1) }' \
    || fail "bf16 accuracy ${a16}% is more than one point below fp32's ${a32}%"
fi
"$bin" predict "$tmp/digits_bf16.onnx" --data "$m/digits_val_x.npy" --output "$tmp/pred.npy" --precision bf16 \
  || fail "predict --precision bf16 failed"
[ -s "$tmp/pred.npy" ] || fail "predict --precision bf16 wrote nothing"
expect_fail 2 "--device takes one device" "$bin" predict "$tmp/digits_bf16.onnx" --data "$m/digits_val_x.npy" \
  --output "$tmp/pred2.npy" --device cpu:0,cpu:1

# --pipeline outside mpirun or srun (or in a build without MPI) is refused
# with how to run it, and trains nothing (tests/test_mpi.sh runs it launched).
env -u OMPI_COMM_WORLD_RANK -u PMI_RANK -u SLURM_STEP_NUM_TASKS "$bin" train "$root/models/mlp_op17.onnx" \
  --synthetic 64 --batch 16 --steps 1 --pipeline 2 --save "$tmp/never.onnx" >"$tmp/out.txt" 2>"$tmp/err.txt"
got=$?
[ "$got" -eq 1 ] || [ "$got" -eq 2 ] || fail "--pipeline outside mpirun exited $got"
grep -qE "mpirun -np N or srun -n N|built without MPI" "$tmp/err.txt" || fail "--pipeline outside mpirun said '$(cat "$tmp/err.txt")'"
[ ! -e "$tmp/never.onnx" ] || fail "--pipeline outside mpirun saved a model"
"$bin" train --help | grep -q -- "--pipeline P" || fail "train --help lacks --pipeline"

"$bin" --help | grep -q "inspect" || fail "--help lists no inspect"
"$bin" inspect --help | grep -q -- "--batch" || fail "inspect --help lacks --batch"
"$bin" devices --help | grep -q "devices" || fail "devices --help"
"$bin" devices | grep -q "^cpu" || fail "devices lists no cpu"
"$bin" --version | grep -q "gpipe-onnx" || fail "--version"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "cli: all checks passed"
