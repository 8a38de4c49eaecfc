#!/usr/bin/env bash
# Runs the CUDA test suite on a machine with a GPU: every tests/test_cuda_*
# binary of a build, test_cuda_conv again through cuDNN's graph API and
# test_state's kill and resume runs on the GPU, then (unless --no-sanitizer) each again under
# compute-sanitizer's memcheck, which must report no errors. Prints one line
# per test and a summary; exits non-zero when anything failed.
#
#   scripts/cuda_tests.sh [--no-sanitizer] [BUILD_DIR]   (default: build)
#
# With CUDA_TEST_LOGS=DIR, each test's whole output is kept in DIR/<test>.log.
# With CUDA_TEST_JOBS=N (default 1), N binaries run at a time, in the plain
# pass (the GPU holds several small tests at once; one at a time, the suite
# with its settings' variants ran past 400 s before the last four were
# added) and in the memcheck pass
# (under the sanitizer each is bound by its host thread, not the GPU, so on
# a machine with several cores N of them take about the time of the
# slowest); the lines then come in the order the runs finish.
# With CUDA_TEST_PART=K/N, only the K-th of N shares of the runs (every
# N-th, from the K-th, in the order above): a suite too long for one sitting
# runs as N calls, K = 1..N, which together run everything once.
#
# The same binaries that `meson test -C build --suite cuda` runs; this script
# exists for machines that have the binaries but not the build system.
set -uo pipefail
cd "$(dirname "$0")/.."

sanitize=1
if [ "${1:-}" = "--no-sanitizer" ]; then sanitize=0; shift; fi
build=${1:-build}
export GP_SOURCE_ROOT=${GP_SOURCE_ROOT:-$PWD}
export GP_BUILD_ROOT=${GP_BUILD_ROOT:-$PWD/$build}

part_k=1 part_n=1
if [ -n "${CUDA_TEST_PART:-}" ]; then
    if [[ "$CUDA_TEST_PART" =~ ^([0-9]+)/([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -ge 1 ] &&
        [ "${BASH_REMATCH[1]}" -le "${BASH_REMATCH[2]}" ]; then
        part_k=${BASH_REMATCH[1]} part_n=${BASH_REMATCH[2]}
    else
        echo "cuda_tests.sh: CUDA_TEST_PART must be K/N with 1 <= K <= N, not '$CUDA_TEST_PART'" >&2
        exit 2
    fi
fi
n_runs=0 n_mine=0
# Whether the next run is this part's (counted in the order they are asked for).
mine() {
    n_runs=$((n_runs + 1))
    [ $(((n_runs - 1) % part_n)) -eq $((part_k - 1)) ] || return 1
    n_mine=$((n_mine + 1))
}

shopt -s nullglob
# Test binaries only: a build tree also holds the test_cuda_*.p object folders.
tests=()
for t in "$build"/tests/test_cuda_*; do
    [ -f "$t" ] && [ -x "$t" ] && tests+=("$t")
done
[ ${#tests[@]} -gt 0 ] || { echo "cuda_tests.sh: no test_cuda_* binaries in $build/tests (build with -Dcuda=enabled)" >&2; exit 2; }

failed=0
run() { # label, command...
    local label=$1; shift
    local log; log=$(mktemp)
    local start=$SECONDS
    "$@" >"$log" 2>&1
    local rc=$?
    local summary; summary=$(grep -E 'PASSED|FAILED|skipped|ERROR SUMMARY' "$log" | tail -1)
    case $rc in
        0) printf '%-44s ok      %4ds  %s\n' "$label" $((SECONDS - start)) "$summary" ;;
        77) printf '%-44s skipped %4ds  %s\n' "$label" $((SECONDS - start)) "$summary" ;;
        *) printf '%-44s FAILED  %4ds  (exit %d)\n' "$label" $((SECONDS - start)) "$rc"
           # What failed (every mismatch and error line), then how it ended.
           grep -E 'MISMATCH|ERROR|FAILED|error' "$log" | head -60 | sed 's/^/    /'
           echo "    ..."
           tail -15 "$log" | sed 's/^/    /'
           failed=$((failed + 1)) ;;
    esac
    if [ -n "${CUDA_TEST_LOGS:-}" ]; then
        mkdir -p "$CUDA_TEST_LOGS" && mv "$log" "$CUDA_TEST_LOGS/${label// /_}.log"
    else
        rm -f "$log"
    fi
}

# Runs `run LABEL COMMAND...` in the background, at most CUDA_TEST_JOBS at a
# time; each job reports its failure through a file, since a subshell cannot
# change `failed`.
jobs_max=${CUDA_TEST_JOBS:-1}
fail_dir=$(mktemp -d)
trap 'rm -rf "$fail_dir"' EXIT
# Tests that take the whole GPU's memory skip themselves beside others,
# and run alone after the plain pass.
[ "$jobs_max" -gt 1 ] && export GP_TEST_GPU_SHARED=1
# The tests' CPU references run on OpenMP threads, as many as the cores the
# process may use (util/cpu_cores.h). As tests/meson.build does, they wait
# by sleeping, not spinning; and N binaries at once share the cores instead
# of each taking them all (N x cores threads otherwise, spinning by
# default).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
if [ "$jobs_max" -gt 1 ] && [ -z "${OMP_NUM_THREADS:-}" ]; then
    cores=$(nproc)
    export OMP_NUM_THREADS=$(( cores / jobs_max > 1 ? cores / jobs_max : 1 ))
fi
run_bg() {
    mine || return 0
    if [ "$jobs_max" -le 1 ]; then run "$@"; return; fi
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
    (failed=0; run "$@"; [ $failed -eq 0 ] || touch "$fail_dir/$BASHPID") &
}
# test_cuda_train and its variants first, the slowest binaries, so that N
# at a time end together instead of behind the last long one. Training on
# the GPU also with the kernels' first writes of gradients turned
# off (they are on by default), so both ways stay tested; with every
# convolution result added into its output on the legacy API (residual
# blocks' inputs, float32 weight gradients, 3xTF32's second parts); and
# with residual gradients in their own pass (the BatchNorm statistics pass
# writes them by default).
if [ -x "$build/tests/test_cuda_train" ]; then
    run_bg test_cuda_train "$build/tests/test_cuda_train"
    run_bg "test_cuda_train (no first writers)" env GP_CUDA_FIRST_WRITERS=0 "$build/tests/test_cuda_train"
    # float32 training with the convolutions on FMA too (3xTF32 by default).
    run_bg "test_cuda_train (convolutions on FMA)" env GP_CONV_FP32=fma "$build/tests/test_cuda_train"
    run_bg "test_cuda_train (added results on the legacy API)" env GP_CONV_ADD_API=legacy \
        "$build/tests/test_cuda_train"
    run_bg "test_cuda_train (residual gradients in their own pass)" env GP_BN_RES_SUMS=0 \
        "$build/tests/test_cuda_train"
    run_bg "test_cuda_train (3xTF32 batch blocks)" env GP_CONV_X3_BATCH=blocked "$build/tests/test_cuda_train"
    run_bg "test_cuda_train (graph API adding with beta 1)" env GP_CONV_API=graph GP_CONV_ADD_API=graph-beta \
        "$build/tests/test_cuda_train"
fi
for t in "${tests[@]}"; do [ "$(basename "$t")" != test_cuda_train ] && run_bg "$(basename "$t")" "$t"; done
# The convolutions again on each of cuDNN's APIs alone (the default measures
# both and runs the faster), with the backward on float32 copies, and
# float32 on cuDNN's FMA algorithms (GP_CONV_FP32=fma; the default 3xTF32,
# cuda/conv_x3.h, runs in every other run).
graph_conv=()
if [ -x "$build/tests/test_cuda_conv" ]; then
    graph_conv=(env GP_CONV_API=graph "$build/tests/test_cuda_conv")
    run_bg "test_cuda_conv (graph API)" "${graph_conv[@]}"
    run_bg "test_cuda_conv (legacy API)" env GP_CONV_API=legacy "$build/tests/test_cuda_conv"
    run_bg "test_cuda_conv (staged backward)" env GP_CONV_BF16_BACKWARD=staged GP_CONV_ACCUMULATE=float \
        "$build/tests/test_cuda_conv"
    run_bg "test_cuda_conv (float32 on FMA)" env GP_CONV_FP32=fma "$build/tests/test_cuda_conv"
    # Every result added into its output (a Conv's dX, a float32 dW,
    # 3xTF32's second parts) on the legacy API wherever the graph API won
    # the plain call, then measured against the graph API's add alone,
    # without the engines' own beta 1 (by default all three ways are
    # measured).
    run_bg "test_cuda_conv (added results on the legacy API)" env GP_CONV_ADD_API=legacy \
        "$build/tests/test_cuda_conv"
    run_bg "test_cuda_conv (added results measured)" env GP_CONV_ADD_API=measured "$build/tests/test_cuda_conv"
    # 3xTF32's ConvTranspose weight gradients with their operands split in
    # two blocks of the batch (one copy fewer written; off by default; a
    # Conv's take the data gradient's split of dY instead).
    run_bg "test_cuda_conv (3xTF32 batch blocks)" env GP_CONV_X3_BATCH=blocked "$build/tests/test_cuda_conv"
    # Float32 channels-last input channels in runs of 8, as before runs of
    # 4 became the default: fewer than 8 padded to 8 (conv.cu
    # image_channel_run).
    run_bg "test_cuda_conv (float32 channel runs of 8)" env GP_CONV_FLOAT32_RUN=8 "$build/tests/test_cuda_conv"
    # Float32 channels-last input channels not padded at all (cuDNN pads
    # inside the engines that need it), convolutions and whole training runs.
    run_bg "test_cuda_conv (float32 channels unpadded)" env GP_CONV_FLOAT32_RUN=1 "$build/tests/test_cuda_conv"
    run_bg "test_cuda_train (float32 channels unpadded)" env GP_CONV_FLOAT32_RUN=1 "$build/tests/test_cuda_train"
    # Convolution filters held channels-last by the executor, made once per
    # step (pipeline/plan.h; off by default, README says why): whole
    # training runs against the CPU, eager and captured as CUDA graphs.
    run_bg "test_cuda_train (channels-last filter copies)" env GP_CHANNELS_LAST_FILTERS=1 "$build/tests/test_cuda_train"
    run_bg "test_cuda_step_graph (channels-last filter copies)" env GP_CHANNELS_LAST_FILTERS=1 \
        "$build/tests/test_cuda_step_graph"
    # Each step's inputs copied from the host at its start, the way without
    # uploads ahead (pipeline/inputs_ahead.c; the default uploads the next
    # step's during the step): whole training runs against the CPU, eager
    # and captured as CUDA graphs.
    run_bg "test_cuda_train (inputs not uploaded ahead)" env GP_INPUTS_AHEAD=0 "$build/tests/test_cuda_train"
    run_bg "test_cuda_step_graph (inputs not uploaded ahead)" env GP_INPUTS_AHEAD=0 "$build/tests/test_cuda_step_graph"
    # Candidates timed behind a held stream, their GPU time alone
    # (cuda/conv_measure.h; off by default): any choice must give results
    # within the bounds, and the gate must never hang a call.
    run_bg "test_cuda_conv (timed behind a stream gate)" env GP_CONV_TIME_GATE=1 "$build/tests/test_cuda_conv"
    # Results added by the graph API's engines themselves (beta 1 through
    # cuDNN's backend descriptors; by default measured against the other
    # two ways), forced for every added call, on
    # the graph API alone so that every added call is one of its.
    run_bg "test_cuda_conv (graph API adding with beta 1)" env GP_CONV_API=graph GP_CONV_ADD_API=graph-beta \
        "$build/tests/test_cuda_conv"
fi
# The plain runs in flight finish first (test_state below times its
# children and kills them: alone on the GPU).
wait
failed=$((failed + $(find "$fail_dir" -type f | wc -l)))
rm -f "$fail_dir"/*
if [ -n "${GP_TEST_GPU_SHARED:-}" ] && [ -x "$build/tests/test_cuda_train" ] && mine; then
    run "test_cuda_train (out of memory, alone)" env GP_TEST_GPU_SHARED=0 GP_TEST_FILTER=test_out_of_memory \
        "$build/tests/test_cuda_train"
fi
# The kill -9 and resume runs of test_state, training on the GPU (it runs the
# command line as child processes, so it stays out of the memcheck pass).
if ! mine; then
    :
elif [ -x "$build/tests/test_state" ] && [ -x "$build/src/gpipe-onnx" ]; then
    run "test_state (cuda:0)" env GP_STATE_DEVICE=cuda:0 "$build/tests/test_state" "$build/src/gpipe-onnx"
else
    echo "test_state or gpipe-onnx not in $build: the GPU kill and resume runs were not run"
    failed=$((failed + 1))
fi
if [ $sanitize = 1 ]; then
    if command -v compute-sanitizer >/dev/null 2>&1; then
        # Leaks and memcheck errors both fail: --error-exitcode makes them count.
        # Failed API calls are not reported: the tests provoke some on purpose
        # (allocations too large, invalid launches) to check our messages.
        memcheck=(compute-sanitizer --tool memcheck --error-exitcode 99 --report-api-errors no --leak-check full)
        for t in "${tests[@]}"; do
            run_bg "$(basename "$t") (memcheck)" "${memcheck[@]}" "$t"
        done
        [ ${#graph_conv[@]} -gt 0 ] &&
            run_bg "test_cuda_conv (graph API, memcheck)" env GP_CONV_API=graph "${memcheck[@]}" "$build/tests/test_cuda_conv"
        wait
        failed=$((failed + $(find "$fail_dir" -type f | wc -l)))
    else
        echo "compute-sanitizer not found: the memcheck pass was not run"
        failed=$((failed + 1))
    fi
fi
what="cuda suite"
[ "$part_n" -gt 1 ] && what="cuda suite (part $part_k of $part_n: $n_mine of $n_runs runs)"
if [ $failed -eq 0 ]; then echo "$what: all passed"; else echo "$what: $failed FAILED"; fi
[ $failed -eq 0 ]
