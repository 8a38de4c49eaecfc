#!/usr/bin/env bash
# Data-parallel replicas under mpirun (CPU devices, oversubscribed on a small
# machine): N = P stages x D replicas, rank = replica x P + stage. D
# replicas of --chunks M compute the same micro-batches as one process with
# --chunks D x M (the same rows, the same dropout masks); each stage's
# gradients are summed over its replicas in replica order before the step.
# So:
#   - every step's loss equals one process's in its first step, and within
#     LOSS_TOL after (the weights then differ in their last bits);
#   - with SGD the saved model is within MODEL_TOL of one process's
#     (model_diff: the largest difference in a tensor relative to its
#     largest value) after 5 steps, and another --lr is far outside that;
#     its BatchNorm running statistics too with --deferred-batch-norm
#     (summed over the replicas), not without (each replica's own: rank 0
#     saves replica 0's); with AdamW, whose steps are as large for a
#     gradient of rounding noise (a convolution's bias before a BatchNorm)
#     as for a real one, within 2 x lr x steps;
#   - the gradients summed in small buckets overlapped with the backward
#     (--bucket-kib 1): byte for byte the model of one bucket;
#   - clipped by --clip-norm, the same (the norm over every stage's summed
#     gradients);
#   - with one micro-batch per replica, the MLP (whose layers add each
#     micro-batch's parameter gradient once) is byte for byte one process's;
#   - a batch the replicas cannot share equally is refused, said once;
#   - a replica's rank killed or stopped mid-training ends the job nonzero
#     within seconds (stopped: within its --comm-timeout, named).
#
#   tests/test_mpi_replicas.sh MPIRUN GPIPE_ONNX MODEL_DIFF
set -u
mpirun="$1" bin="$2" model_diff="$3"
root="${GP_SOURCE_ROOT:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# README, "Several processes": the gradients' sums differ from one
# process's in their rounding only; after 5 steps the measured figures are
# about 1e-8 (losses, relative) and 1e-7 (SGD's weights): the bounds leave
# room, and another learning rate is far outside them.
LOSS_TOL=1e-6
MODEL_TOL=1e-5

export OMPI_MCA_btl_vader_single_copy_mechanism=none
run() { # ranks, command...: output in $tmp/out, exit status in $status, seconds in $took
  local n="$1"; shift
  local start=$SECONDS
  timeout -k 5 120 "$mpirun" --oversubscribe --allow-run-as-root -np "$n" "$@" >"$tmp/out" 2>&1
  status=$?
  took=$((SECONDS - start))
  [ "$status" -ne 139 ] || echo "note: mpirun crashed (SIGSEGV) running $*"
}
show() { echo "    (exit status $status after ${took}s)"; sed 's/^/    /' "$tmp/out" | head -40; }
losses() { grep -o '"loss": [^,]*' "$1" | sed 's/"loss": //'; }

# Every step's loss within LOSS_TOL (relative) of one process's, the first equal.
same_losses() { # what, one.jsonl, many.jsonl
  local what="$1"
  [ "$(losses "$2" | wc -l)" -eq 5 ] || { fail "$what: not 5 step losses"; return; }
  [ "$(losses "$2" | head -1)" = "$(losses "$3" | head -1)" ] ||
    fail "$what: the first step's loss differs from one process's ($(losses "$2" | head -1) vs $(losses "$3" | head -1))"
  paste <(losses "$2") <(losses "$3") | awk -v tol="$LOSS_TOL" -v what="$what" '
    { d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > worst) worst = r; n++ }
    END { printf "%s: %d step losses, worst relative difference %.3g\n", what, n, worst; exit !(n == 5 && worst <= tol) }' ||
    fail "$what: step losses further than $LOSS_TOL from one process's"
}

# ---- the digits CNN (Conv, BatchNorm, Dropout, Gemm) on its data ----
digits=(train "$root/models/digits_cnn_op17.onnx" --data "$root/models/digits_train_x.npy"
        --labels "$root/models/digits_train_y.npy" --batch 32 --steps 5)
replicas() { # P, D, chunks per replica, balance ("" for one stage), model_diff's options, extra options...
  local p="$1" d="$2" m="$3" balance="$4" diff_opts="$5"; shift 5
  local what="$p stages x $d replicas, --chunks $m $*" devices=cpu:0 k
  for ((k = 1; k < p; k++)); do devices+=",cpu:$k"; done
  local split=()
  [ -n "$balance" ] && split=(--balance "$balance")
  rm -f "$tmp"/one.* "$tmp"/many.*
  "$bin" "${digits[@]}" --quiet --devices "$devices" "${split[@]}" --chunks $((d * m)) "$@" --save "$tmp/one.onnx" \
    --metrics "$tmp/one.jsonl" >"$tmp/out" 2>&1 || { fail "$what: one process failed"; show; return; }
  run $((p * d)) "$bin" "${digits[@]}" --pipeline "$p" --devices cpu:0 "${split[@]}" --chunks "$m" "$@" \
    --save "$tmp/many.onnx" --metrics "$tmp/many.jsonl"
  if [ "$status" -ne 0 ]; then fail "$what: exited $status"; show; return; fi
  # Rank 0 alone reports: one summary, naming the replicas.
  [ "$(grep -c "^training .*$d replicas x $m micro-batch" "$tmp/out")" -eq 1 ] ||
    { fail "$what: not one summary naming the replicas"; show; }
  same_losses "$what" "$tmp/one.jsonl" "$tmp/many.jsonl"
  # shellcheck disable=SC2086 # the options are words
  "$model_diff" $diff_opts "$tmp/one.onnx" "$tmp/many.onnx" "$MODEL_TOL" | sed "s/^model_diff:/  /" ||
    fail "$what: the saved model is further than $MODEL_TOL from one process's"
}
replicas 2 2 2 5,5 --params --optimizer sgd
# The gradients' sums in buckets of 1 KiB (about one sum per parameter, each
# started while the backward goes on) instead of one: the same bits.
cp "$tmp/many.onnx" "$tmp/one_bucket.onnx"
run 4 "$bin" "${digits[@]}" --quiet --pipeline 2 --devices cpu:0 --balance 5,5 --chunks 2 --optimizer sgd \
  --bucket-kib 1 --save "$tmp/buckets.onnx"
[ "$status" -eq 0 ] || { fail "--bucket-kib 1: exited $status"; show; }
cmp -s "$tmp/one_bucket.onnx" "$tmp/buckets.onnx" || fail "--bucket-kib 1 trained another model than one bucket"
# The comparison can fail: another learning rate is another model.
"$bin" "${digits[@]}" --quiet --devices cpu:0 --chunks 4 --optimizer sgd --lr 0.02 --save "$tmp/other.onnx" \
  >"$tmp/out" 2>&1 || fail "one process, --lr 0.02: failed"
"$model_diff" --params "$tmp/one.onnx" "$tmp/other.onnx" "$MODEL_TOL" >"$tmp/diff" &&
  { fail "models trained with other learning rates were within $MODEL_TOL"; cat "$tmp/diff"; }
# Clipped (0.5 clips every step here): the norm of the replicas' summed
# gradients over both stages, one process's up to those sums' rounding.
replicas 2 2 2 4,6 "" --optimizer sgd --pipeline-schedule 1f1b --deferred-batch-norm --clip-norm 0.5
replicas 1 2 2 "" --params --optimizer sgd
replicas 1 2 1 "" "" --optimizer sgd --checkpoint never --deferred-batch-norm
# AdamW at its default lr of 0.001, 5 steps.
replicas 2 2 2 5,5 "--abs 0.01" --optimizer adamw --lr 0.001 --deferred-batch-norm

# ---- the MLP, one micro-batch per replica: byte for byte ----
mlp=(train "$root/models/mlp_op17.onnx" --synthetic 256 --batch 32 --steps 5 --quiet)
for p in 1 2; do
  devices=cpu:0
  [ "$p" = 2 ] && devices=cpu:0,cpu:1
  "$bin" "${mlp[@]}" --devices "$devices" --chunks 2 --optimizer adamw --save "$tmp/one.onnx" \
    --metrics "$tmp/one.jsonl" >"$tmp/out" 2>&1 || { fail "mlp, one process: failed"; show; }
  run $((2 * p)) "$bin" "${mlp[@]}" --pipeline "$p" --chunks 1 --optimizer adamw --save "$tmp/many.onnx" \
    --metrics "$tmp/many.jsonl"
  if [ "$status" -ne 0 ]; then fail "mlp, $p stages x 2 replicas: exited $status"; show; continue; fi
  cmp -s "$tmp/one.onnx" "$tmp/many.onnx" || fail "mlp, $p stages x 2 replicas of 1 micro-batch: another model than one process"
  [ "$(losses "$tmp/one.jsonl")" = "$(losses "$tmp/many.jsonl")" ] || fail "mlp, $p stages x 2 replicas: other step losses"
done

# ---- a batch the replicas cannot share: refused on every rank, said once ----
run 4 "$bin" "${mlp[@]}" --pipeline 2 --batch 30 --chunks 2
[ "$status" -ne 0 ] || fail "--batch 30 over 2 replicas of 2 chunks was taken"
[ "$(grep -c "it must be a multiple of 4 (a share would not cut into equal micro-batches)" "$tmp/out")" -eq 1 ] ||
  { fail "--batch 30, 2 replicas, 2 chunks: not said once"; show; }
run 2 "$bin" "${mlp[@]}" --pipeline 1 --batch 33
[ "$status" -ne 0 ] || fail "--batch 33 over 2 replicas was taken"
[ "$(grep -c "shared by 2 replicas (2 processes / --pipeline 1).*multiple of 2 (the replicas' shares would differ)" "$tmp/out")" -eq 1 ] ||
  { fail "--batch 33, 2 replicas: not said once"; show; }

# ---- a replica's rank killed or stopped mid-training ends the job ----
# Rank 3 is stage 1 of replica 1: its frontier partner (rank 2) and its
# gradient-sum partner (rank 1, stage 1 of replica 0) both wait on it.
cat >"$tmp/replica.sh" <<SH
#!/usr/bin/env bash
args=(${digits[*]:0:6} --batch 32 --chunks 2 --steps 1000000 --quiet --pipeline 2 --balance 5,5 --comm-timeout \$GP_TIMEOUT)
if [ "\$OMPI_COMM_WORLD_RANK" = 3 ]; then
  "$bin" "\${args[@]}" & pid=\$!
  sleep 3
  kill -\$GP_SIGNAL \$pid
  wait \$pid
  exit \$?
fi
exec "$bin" "\${args[@]}"
SH
chmod +x "$tmp/replica.sh"
GP_SIGNAL=KILL GP_TIMEOUT=300 run 4 "$tmp/replica.sh"
[ "$status" -ne 0 ] || { fail "a replica's rank killed mid-training left the job exiting 0"; show; }
[ "$took" -lt 30 ] || fail "a replica's rank killed mid-training ended the job only after ${took}s"
GP_SIGNAL=STOP GP_TIMEOUT=4 run 4 "$tmp/replica.sh"
[ "$status" -ne 0 ] || { fail "a replica's rank stopped mid-training left the job exiting 0"; show; }
[ "$took" -lt 40 ] || fail "a replica's rank stopped mid-training (timeout 4 s) ended the job only after ${took}s"
# Its partners name it (the one that reports first may have failed on,
# and says the first failure).
grep -Eq "heard nothing from rank 3|rank 3 did not take" "$tmp/out" || { fail "the stopped rank was not named"; show; }

if [ "$failures" -eq 0 ]; then
  echo "test_mpi_replicas: all passed"
  exit 0
fi
echo "test_mpi_replicas: $failures failed"
exit 1
