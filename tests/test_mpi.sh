#!/usr/bin/env bash
# Several processes under mpirun (4 ranks, oversubscribed on a small
# machine): the launcher's ranks, reproducible sums over ranks and groups,
# point-to-point messages, the ranks refusing a mismatched configuration,
# and a rank that hangs, dies or quits making the whole job end nonzero
# within a bounded time, naming it where it can be named; then pipeline
# stages as processes training the same model, bit for bit, as one process
# with the same balance, and a stage killed or stopped mid-training ending
# the job; a model whose stages share a tied parameter, clipped by the
# whole model's norm, equal to one process.
#
#   tests/test_mpi.sh MPIRUN MPI_CHECK GPIPE_ONNX
set -u
mpirun="$1" check="$2" bin="$3"
root="${GP_SOURCE_ROOT:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# As root (CI, containers) Open MPI needs to be told that it is fine; 4
# ranks on fewer cores need --oversubscribe. Shared-memory copies across
# processes (CMA) are refused in some containers: plain copies instead.
export OMPI_MCA_btl_vader_single_copy_mechanism=none
run() { # ranks, command...: output in $tmp/out, exit status in $status, seconds in $took
  local n="$1"; shift
  local start=$SECONDS
  # A hard bound: a test that hangs fails instead of stalling the suite.
  timeout -k 5 120 "$mpirun" --oversubscribe --allow-run-as-root -np "$n" "$@" >"$tmp/out" 2>&1
  status=$?
  took=$((SECONDS - start))
  # Open MPI 4.1's mpirun was once seen to crash (SIGSEGV) while ending a
  # job: said, not failed on; each test judges the status it expects.
  [ "$status" -ne 139 ] || echo "note: mpirun crashed (SIGSEGV) running $*"
}
show() { echo "    (exit status $status after ${took}s)"; sed 's/^/    /' "$tmp/out" | head -40; }

# ---- the launcher's ranks, as each process reads them ----
run 4 "$check" ranks 30
if [ "$status" -ne 0 ]; then fail "ranks exited $status"; show; fi
for r in 0 1 2 3; do
  grep -qx "rank $r of 4, local $r of 4, launcher Open MPI" "$tmp/out" || { fail "rank $r did not report itself"; show; }
done

# ---- sums: bit for bit the serial sum in group order, and equal run to run ----
digests=()
for attempt in 1 2; do
  run 4 "$check" sums 60
  if [ "$status" -ne 0 ]; then fail "sums (run $attempt) exited $status"; show; fi
  [ "$(grep -c ' sums ok' "$tmp/out")" -eq 4 ] || { fail "sums (run $attempt): not every rank checked its sums"; show; }
  digests+=("$(grep '^rank 0 sums ok' "$tmp/out" | sed 's/.*digest //')")
done
[ -n "${digests[0]}" ] && [ "${digests[0]}" = "${digests[1]}" ] || fail "two runs summed differently: ${digests[*]}"
# Every rank holds the same bits.
run 3 "$check" sums 60
if [ "$status" -ne 0 ]; then fail "sums on 3 ranks exited $status"; show; fi
[ "$(grep ' sums ok' "$tmp/out" | sed 's/.*digest //' | sort -u | wc -l)" -eq 1 ] || { fail "ranks hold different sums"; show; }

# ---- point to point ----
run 4 "$check" p2p 60
if [ "$status" -ne 0 ]; then fail "p2p exited $status"; show; fi
[ "$(grep -c ' p2p ok' "$tmp/out")" -eq 4 ] || { fail "p2p: not every rank passed"; show; }
run 2 "$check" short 30
[ "$status" -ne 0 ] || fail "a message shorter than expected was taken"
grep -q "rank 0 sent rank 1 a message of 6 bytes where 8 were expected" "$tmp/out" || { fail "short message not named"; show; }

# ---- failures end the job within a bounded time (generous: oversubscribed) ----
run 4 "$check" hang 3 3
[ "$status" -ne 0 ] || fail "a hung rank left the job exiting 0"
[ "$took" -lt 60 ] || fail "a hung rank (timeout 3 s) ended the job only after ${took}s"
grep -q "heard nothing from rank 3 within 3 s" "$tmp/out" || { fail "the hung rank was not named"; show; }
# A rank that times out follows the chain of waiting ranks to its end:
# rank 0 waits on 1, which waits on 2 (silent), and rank 0 fails first.
run 3 "$check" chain 2
[ "$status" -ne 0 ] || fail "a chain of waiting ranks left the job exiting 0"
grep -q "rank 0 heard nothing from rank 1 within 2 s.*; rank 1 has waited [0-9.]* s to hear from rank 2; rank 2 did not answer within 1 s whom it waits for: rank 2 is dead" "$tmp/out" ||
  { fail "the end of the chain was not named"; show; }
run 2 "$check" circle 2
[ "$status" -ne 0 ] || fail "two ranks waiting on each other left the job exiting 0"
grep -q "rank 1 has waited [0-9.]* s to hear from rank 0 (this rank): the ranks wait on each other" "$tmp/out" ||
  { fail "two ranks waiting on each other were not said to"; show; }
for mode in die quit; do
  run 4 "$check" "$mode" 10 2
  [ "$status" -ne 0 ] || { fail "a rank that ${mode}s left the job exiting 0"; show; }
  [ "$took" -lt 60 ] || fail "a rank that ${mode}s ended the job only after ${took}s"
  grep -q "the job went on without" "$tmp/out" && { fail "the job went on without the rank that ${mode}s"; show; }
done

# ---- the command line: --pipeline ----
model="$root/models/mlp_op17.onnx"
train=(train "$model" --synthetic 64 --batch 16 --steps 2 --quiet)
# Not launched: a clear usage error.
env -u OMPI_COMM_WORLD_RANK "$bin" "${train[@]}" --pipeline 2 >"$tmp/out" 2>&1
[ $? -eq 2 ] || fail "--pipeline outside mpirun did not exit 2"
grep -q "mpirun -np N or srun -n N" "$tmp/out" || { fail "--pipeline outside mpirun: no hint"; show; }
# Not a multiple of the stages.
run 3 "$bin" "${train[@]}" --pipeline 2
[ "$status" -ne 0 ] || fail "3 processes for --pipeline 2 were taken"
grep -q "started 3 processes, not a multiple of --pipeline 2" "$tmp/out" || { fail "3 ranks, --pipeline 2: no reason"; show; }
# The whole mini-batch is shared by the replicas, each share cut into chunks.
run 4 "$bin" train "$model" --synthetic 64 --batch 20 --chunks 4 --steps 1 --quiet --pipeline 2
[ "$status" -ne 0 ] || fail "--batch 20 over 2 replicas of 4 chunks was taken"
[ "$(grep -c "it must be a multiple of 8" "$tmp/out")" -eq 1 ] || { fail "--batch 20, 2 replicas, 4 chunks: not said once"; show; }
# One rank with another --lr: every rank refuses, naming it.
cat >"$tmp/lr.sh" <<SH
#!/usr/bin/env bash
lr=0.01
[ "\$OMPI_COMM_WORLD_RANK" = 2 ] && lr=0.02
exec "$bin" ${train[*]} --lr \$lr --pipeline 2
SH
chmod +x "$tmp/lr.sh"
run 4 "$tmp/lr.sh"
[ "$status" -ne 0 ] || fail "ranks with different --lr trained"
grep -q "rank 2's --lr 0.02 differs from rank 0's 0.01" "$tmp/out" || { fail "the --lr mismatch was not named"; show; }
grep -o "rank [0-9]*'s --[a-z-]* [^ ]* differs" "$tmp/out" | grep -v "^rank 2's --lr" && { fail "ranks that agree were named"; show; }
[ "$took" -lt 60 ] || fail "refusing a mismatch took ${took}s"
# Rank 3 reads its own copy of the model: the same bytes from another path
# agree; another model is named.
cp "$model" "$tmp/copy.onnx"
for other in "$tmp/copy.onnx" "$root/models/mlp_op13.onnx"; do
  cat >"$tmp/model.sh" <<SH
#!/usr/bin/env bash
m="$model"
[ "\$OMPI_COMM_WORLD_RANK" = 3 ] && m="$other"
exec "$bin" train "\$m" ${train[*]:2} --pipeline 2
SH
  chmod +x "$tmp/model.sh"
  run 4 "$tmp/model.sh"
  if [ "$other" = "$tmp/copy.onnx" ]; then
    [ "$status" -eq 0 ] || { fail "a copy of the model at another path was refused"; show; }
  else
    [ "$status" -ne 0 ] || fail "4 ranks trained with another model on rank 3"
    grep -q "rank 3's model $other (" "$tmp/out" || { fail "another model on rank 3 was not named"; show; }
  fi
done
# The same settings everywhere: agreed, and 2 stages x 2 replicas train
# (tests/test_mpi_replicas.sh compares them with one process).
run 4 "$bin" "${train[@]}" --pipeline 2
[ "$status" -eq 0 ] || { fail "2 stages x 2 replicas exited $status"; show; }
grep -q "differs" "$tmp/out" && { fail "equal settings were called different"; show; }
# One process under mpirun trains, to the same model as without it.
run 1 "$bin" "${train[@]}" --pipeline 1 --save "$tmp/mpi.onnx"
if [ "$status" -ne 0 ]; then fail "one rank with --pipeline 1 exited $status"; show; fi
"$bin" "${train[@]}" --save "$tmp/plain.onnx" >"$tmp/out" 2>&1 || { fail "the plain run failed"; show; }
cmp -s "$tmp/mpi.onnx" "$tmp/plain.onnx" || fail "one rank under mpirun trained another model than one process"

# ---- pipeline stages as processes (one replica, CPU devices) ----
# The digits CNN (BatchNorm, Dropout) on its data: rank k runs stage k.
# Saved models byte for byte and every step's loss equal to one process
# running the same stages on CPU devices of its own (and the validation
# figures, each stage's process evaluating its part).
digits=(train "$root/models/digits_cnn_op17.onnx" --data "$root/models/digits_train_x.npy"
        --labels "$root/models/digits_train_y.npy" --batch 32 --chunks 4 --steps 5 --quiet)
losses() { grep -o '"loss": [^,]*' "$1"; }
stages() { # P, balance, extra options...: one process against P ranks
  local p="$1" balance="$2"; shift 2
  local devices=cpu:0 k
  for ((k = 1; k < p; k++)); do devices+=",cpu:$k"; done
  rm -f "$tmp/one.onnx" "$tmp/many.onnx" "$tmp/one.jsonl" "$tmp/many.jsonl"
  "$bin" "${digits[@]}" --devices "$devices" --balance "$balance" "$@" --save "$tmp/one.onnx" \
    --metrics "$tmp/one.jsonl" >"$tmp/out" 2>&1 || { fail "one process, balance $balance $*: failed"; show; return; }
  run "$p" "$bin" "${digits[@]}" --pipeline "$p" --devices cpu:0 --balance "$balance" "$@" --save "$tmp/many.onnx" \
    --metrics "$tmp/many.jsonl"
  if [ "$status" -ne 0 ]; then fail "--pipeline $p, balance $balance $*: exited $status"; show; return; fi
  cmp -s "$tmp/one.onnx" "$tmp/many.onnx" || fail "--pipeline $p, balance $balance $*: another model than one process"
  [ "$(losses "$tmp/one.jsonl" | wc -l)" -eq 5 ] || fail "one process, balance $balance $*: not 5 step losses"
  [ "$(losses "$tmp/one.jsonl")" = "$(losses "$tmp/many.jsonl")" ] ||
    { fail "--pipeline $p, balance $balance $*: other step losses than one process"; diff <(losses "$tmp/one.jsonl") <(losses "$tmp/many.jsonl") | head; }
  # Validation, where asked: the same figures.
  [ "$(grep -o '"val_[a-z]*": [^,}]*' "$tmp/one.jsonl")" = "$(grep -o '"val_[a-z]*": [^,}]*' "$tmp/many.jsonl")" ] ||
    fail "--pipeline $p, balance $balance $*: other validation figures than one process"
  case "$*" in *--val-data*) grep -q '"val_loss"' "$tmp/many.jsonl" || fail "--pipeline $p $*: no validation figures";; esac
  # Only rank 0 reports: one summary line.
  [ "$(grep -c "^stage  *layers" "$tmp/out")" -le 1 ] || { fail "--pipeline $p: more than one rank reported"; show; }
}
stages 2 5,5 --val-data "$root/models/digits_val_x.npy" --val-labels "$root/models/digits_val_y.npy"
stages 2 4,6 --pipeline-schedule 1f1b --optimizer adamw
stages 4 2,3,3,2
stages 4 2,3,3,2 --pipeline-schedule 1f1b --checkpoint never --deferred-batch-norm
# The comparison can fail: another learning rate is another model.
"$bin" "${digits[@]}" --devices cpu:0,cpu:1,cpu:2,cpu:3 --balance 2,3,3,2 --lr 0.02 --save "$tmp/other.onnx" \
  >"$tmp/out" 2>&1 || fail "one process, --lr 0.02: failed"
cmp -s "$tmp/other.onnx" "$tmp/many.onnx" && fail "models trained with other learning rates compared equal"
# ---- tied parameters, and clipping by the whole model's norm ----
# The GPT whose head reads its token embedding (tests/data, from
# models/export_tied.py): the stages holding the embedding's copies sum
# their gradients; --clip-norm small enough to clip, the norm counting the
# embedding once; momentum and weight decay. Against one process running
# the model as one stage, byte for byte: 2 and 4 stage processes, and 2
# stages x 2 replicas of one micro-batch each (README, "Tied parameters").
tied=(train "$root/tests/data/tied_gpt_op17.onnx" --synthetic 48 --batch 12 --steps 4 --quiet --momentum 0.9
      --weight-decay 0.01 --clip-norm 0.05)
tied_case() { # ranks, P, chunks per replica, extra options...
  local n="$1" p="$2" m="$3"; shift 3
  local what="tied GPT, $n ranks, --pipeline $p, --chunks $m $*"
  rm -f "$tmp/one.onnx" "$tmp/many.onnx" "$tmp/one.jsonl" "$tmp/many.jsonl"
  "$bin" "${tied[@]}" --devices cpu:0 --chunks $((n / p * m)) "$@" --save "$tmp/one.onnx" --metrics "$tmp/one.jsonl" \
    >"$tmp/out" 2>&1 || { fail "$what: one process failed"; show; return; }
  run "$n" "$bin" "${tied[@]}" --pipeline "$p" --devices cpu:0 --chunks "$m" "$@" --save "$tmp/many.onnx" \
    --metrics "$tmp/many.jsonl"
  if [ "$status" -ne 0 ]; then fail "$what: exited $status"; show; return; fi
  cmp -s "$tmp/one.onnx" "$tmp/many.onnx" || fail "$what: another model than one process"
  [ "$(losses "$tmp/one.jsonl" | wc -l)" -eq 4 ] && [ "$(losses "$tmp/one.jsonl")" = "$(losses "$tmp/many.jsonl")" ] ||
    fail "$what: other step losses than one process"
}
tied_case 2 2 3
tied_case 4 4 3 --pipeline-schedule 1f1b
tied_case 4 2 1
# The comparison can fail: the same run unclipped is another model.
"$bin" "${tied[@]:0:13}" --devices cpu:0 --chunks 2 --save "$tmp/other.onnx" >"$tmp/out" 2>&1 || fail "tied GPT unclipped: failed"
cmp -s "$tmp/other.onnx" "$tmp/many.onnx" && fail "tied GPT: clipped and unclipped models compared equal"
# ---- training states, timelines and profiled balances across processes ----
# States: rank 0 gathers every stage's weights and optimizer state and
# writes them; resuming, each rank takes its stage's part. 4 steps equal 2
# steps and 2 more resumed from the state (AdamW, whose step count and
# moments must come back), and the state at step 2 is one process's, byte
# for byte, which 2 stage processes then continue to the same model; the
# same for 2 stages x 2 replicas.
resume_case() { # ranks, chunks per replica
  local n="$1" m="$2" what="states, $1 ranks"
  local st=(train "$root/models/digits_cnn_op17.onnx" --data "$root/models/digits_train_x.npy"
            --labels "$root/models/digits_train_y.npy" --batch 32 --chunks "$m" --quiet --optimizer adamw
            --balance 5,5 --pipeline 2 --devices cpu:0)
  rm -rf "$tmp/s4" "$tmp/s2" "$tmp/one.onnx" "$tmp/many.onnx"
  run "$n" "$bin" "${st[@]}" --steps 4 --save-state "$tmp/s4" --save-every 2 --save "$tmp/one.onnx"
  [ "$status" -eq 0 ] || { fail "$what: 4 steps exited $status"; show; return; }
  run "$n" "$bin" "${st[@]}" --steps 2 --save-state "$tmp/s2"
  [ "$status" -eq 0 ] || { fail "$what: 2 steps exited $status"; show; return; }
  run "$n" "$bin" "${st[@]}" --steps 4 --resume "$tmp/s2" --save "$tmp/many.onnx"
  [ "$status" -eq 0 ] || { fail "$what: resumed exited $status"; show; return; }
  cmp -s "$tmp/one.onnx" "$tmp/many.onnx" || fail "$what: 2 steps + 2 resumed saved another model than 4 steps"
  cmp -s "$tmp/s4/state-00000002/tensors.bin" "$tmp/s2/state-00000002/tensors.bin" ||
    fail "$what: the states at step 2 of two runs differ"
}
resume_case 2 4
[ -f "$tmp/s4/state-00000004/manifest.json" ] || fail "states: no final state written"
ls -a "$tmp/s4" | grep -q tmp && fail "states: a temporary folder was left"
rm -rf "$tmp/one2"
"$bin" train "$root/models/digits_cnn_op17.onnx" --data "$root/models/digits_train_x.npy" \
  --labels "$root/models/digits_train_y.npy" --batch 32 --chunks 4 --quiet --optimizer adamw --balance 5,5 \
  --devices cpu:0,cpu:1 --steps 2 --save-state "$tmp/one2" >"$tmp/out" 2>&1 || { fail "states: one process failed"; show; }
cmp -s "$tmp/one2/state-00000002/tensors.bin" "$tmp/s2/state-00000002/tensors.bin" ||
  fail "states: 2 stage processes saved another state than one process"
resume_case 4 2
# A period in seconds would be each rank's own clock: refused.
run 2 "$bin" "${train[@]}" --pipeline 2 --save-state "$tmp/s" --save-every 30s
[ "$status" -ne 0 ] || fail "--save-every 30s across processes was taken"
grep -q "give a number of steps" "$tmp/out" || { fail "--save-every 30s across processes: no reason"; show; }
# A state one rank cannot read is refused by every rank, naming it.
cat >"$tmp/resume.sh" <<SH
#!/usr/bin/env bash
s="$tmp/s2"
[ "\$OMPI_COMM_WORLD_RANK" = 1 ] && s="$tmp/missing"
exec "$bin" ${train[*]} --pipeline 2 --resume "\$s"
SH
chmod +x "$tmp/resume.sh"
run 2 "$tmp/resume.sh"
[ "$status" -ne 0 ] || fail "a state rank 1 cannot read was taken"
grep -q "rank 1" "$tmp/out" || { fail "a state rank 1 cannot read: rank 1 not named"; show; }
# Timelines: one file per rank, its stage's streams, named by rank.
rm -f "$tmp"/t.rank*.json
run 2 "$bin" "${digits[@]}" --pipeline 2 --devices cpu:0 --balance 5,5 --steps 1 --trace "$tmp/t.json"
[ "$status" -eq 0 ] || { fail "--trace on 2 ranks exited $status"; show; }
for r in 0 1; do
  grep -q "\"rank $r (stage $r, replica 0) cpu:0\"" "$tmp/t.rank$r.json" 2>/dev/null || fail "--trace: rank $r's file is missing or unnamed"
  grep -q "\"F s$r m3\"" "$tmp/t.rank$r.json" 2>/dev/null || fail "--trace: rank $r's file lacks its forwards"
done
grep -q '"F s1 m' "$tmp/t.rank0.json" && fail "--trace: rank 0's file holds stage 1's work"
# Each rank receives on a stream of its own (the compute stream only waits
# for it), and names the receive as the copy from the other stage.
grep -q '"receive from previous stage"' "$tmp/t.rank1.json" || fail "--trace: rank 1 has no receive stream"
grep -q '"receive from next stage"' "$tmp/t.rank0.json" || fail "--trace: rank 0 has no receive stream"
grep -q '"copy s0->s1 m3"' "$tmp/t.rank1.json" || fail "--trace: rank 1's receive of micro-batch 3 is not named"
grep -q '"copy s1->s0 m3"' "$tmp/t.rank0.json" || fail "--trace: rank 0's receive of micro-batch 3 is not named"
# --balance memory: rank 0 profiles and splits, every rank takes its split,
# which one process running that split trains to the same model.
run 2 "$bin" "${digits[@]:0:12}" --pipeline 2 --devices cpu:0 --balance memory --steps 2 --save "$tmp/many.onnx"
[ "$status" -eq 0 ] || { fail "--balance memory on 2 ranks exited $status"; show; }
# Rank 0's memory table has every stage's row, stage 1's sent by its process.
for r in 0 1; do
  grep -Eq "^$r +[0-9]+-[0-9]+ +cpu:0 " "$tmp/out" || { fail "2 ranks: rank 0's memory table lacks stage $r"; show; }
done
split=$(grep -A2 '^split' "$tmp/out" | grep -Eo '^(optimal)? +[01] +[0-9]+-[0-9]+' | grep -Eo '[0-9]+-[0-9]+$')
counts=$(echo "$split" | awk -F- '{printf "%s%d", (NR > 1 ? "," : ""), $2 - $1 + 1}')
if [ -z "$counts" ]; then fail "--balance memory on 2 ranks: rank 0 printed no split"; show; else
  "$bin" "${digits[@]}" --devices cpu:0,cpu:1 --balance "$counts" --steps 2 --save "$tmp/one.onnx" >/dev/null 2>&1
  cmp -s "$tmp/one.onnx" "$tmp/many.onnx" || fail "--balance memory on 2 ranks: another model than one process with $counts"
fi
run 2 "$bin" "${digits[@]}" --pipeline 2 --devices cpu:0,cpu:1,cpu:2
[ "$status" -ne 0 ] || fail "3 devices for --pipeline 2 were taken"
grep -q "give one (every rank's) or one per stage" "$tmp/out" || { fail "3 devices for 2 stages: no reason"; show; }
# A stage's process killed (or stopped) mid-training ends the job nonzero
# within seconds, not at the --comm-timeout of 300 s; a stopped one within
# its timeout, named.
cat >"$tmp/stage.sh" <<SH
#!/usr/bin/env bash
args=(${digits[*]:0:6} --batch 32 --chunks 4 --steps 1000000 --quiet --pipeline 4 --balance 2,3,3,2 --comm-timeout \$GP_TIMEOUT)
if [ "\$OMPI_COMM_WORLD_RANK" = 2 ]; then
  "$bin" "\${args[@]}" & pid=\$!
  sleep 3
  kill -\$GP_SIGNAL \$pid
  wait \$pid
  exit \$?
fi
exec "$bin" "\${args[@]}"
SH
chmod +x "$tmp/stage.sh"
GP_SIGNAL=KILL GP_TIMEOUT=300 run 4 "$tmp/stage.sh"
[ "$status" -ne 0 ] || { fail "a stage killed mid-training left the job exiting 0"; show; }
[ "$took" -lt 30 ] || fail "a stage killed mid-training ended the job only after ${took}s"
GP_SIGNAL=STOP GP_TIMEOUT=4 run 4 "$tmp/stage.sh"
[ "$status" -ne 0 ] || { fail "a stage stopped mid-training left the job exiting 0"; show; }
[ "$took" -lt 40 ] || fail "a stage stopped mid-training (timeout 4 s) ended the job only after ${took}s"
# Whichever waiting rank times out first names rank 2: its neighbours
# directly, the others at the end of the chain they follow.
grep -Eq "heard nothing from rank 2|rank 2 did not take|rank 2 did not answer" "$tmp/out" || { fail "the stopped stage was not named"; show; }

if [ "$failures" -eq 0 ]; then
  echo "test_mpi: all passed"
  exit 0
fi
echo "test_mpi: $failures failed"
exit 1
