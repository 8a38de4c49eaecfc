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
assert len(layers) + doc["folded_nodes"] == doc["source_nodes"], "node accounting"
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

expect_fail() { # expected-exit-code message-substring command...
  local code="$1" needle="$2"; shift 2
  "$@" >"$tmp/out.txt" 2>"$tmp/err.txt"
  local got=$?
  [ "$got" -eq "$code" ] || fail "'$*' exited $got, expected $code"
  grep -q -- "$needle" "$tmp/err.txt" || fail "'$*' said '$(cat "$tmp/err.txt")', expected '$needle'"
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
