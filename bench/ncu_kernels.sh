#!/usr/bin/env bash
# Kernel by kernel: time, DRAM bandwidth reached and occupancy of the CUDA
# kernels whose names match a pattern, for one training configuration, under
# Nsight Compute (ncu). For the bandwidth-bound passes (BatchNorm, the
# elementwise ops), the question is how far each kernel's bytes per second
# stand from the device's, and why (too few loads in flight, occupancy).
#
#   bench/ncu_kernels.sh [-o OUT.csv] MODEL.onnx KERNEL_REGEX [gpipe-onnx balance flags...]
#
# e.g.  bench/ncu_kernels.sh /tmp/onnx/resnet50.onnx 'bn_' --batch 128 --precision bf16
#
# It profiles `gpipe-onnx balance MODEL --devices cuda:0 --chunks 1 --repeats 1`
# (one forward and backward of every layer), the first 200 matching launches
# at most, and prints per kernel name: launches, median time (us), median
# DRAM throughput (% of peak), achieved occupancy (%), and bytes moved per
# launch (MB). GPIPE (default build/src/gpipe-onnx) names the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
out=""
if [ "${1:-}" = "-o" ]; then out=$2; shift 2; fi
[ $# -ge 2 ] || { sed -n 2,17p "$0" >&2; exit 2; }
model=$1 pattern=$2
shift 2
command -v ncu >/dev/null || { echo "ncu_kernels.sh: ncu (Nsight Compute) is not on PATH" >&2; exit 2; }
gpipe=${GPIPE:-build/src/gpipe-onnx}
csv=$(mktemp)
trap 'rm -f "$csv"' EXIT
metrics=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,dram__bytes.sum
ncu --csv --page raw --print-units base --kernel-name "regex:$pattern" --launch-count 200 --metrics "$metrics" \
    "$gpipe" balance "$model" --devices cuda:0 --chunks 1 --repeats 1 "$@" >"$csv" 2>/dev/null || {
    echo "ncu_kernels.sh: ncu failed; its output:" >&2
    tail -20 "$csv" >&2
    exit 1
}
[ -n "$out" ] && cp "$csv" "$out"
python3 - "$csv" <<'EOF'
import csv, statistics, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
cols = rows[head]
data = [dict(zip(cols, r)) for r in rows[head + 2:] if len(r) == len(cols)]  # skip the units row
def num(r, k):
    try:
        return float(r[k].replace(",", ""))
    except (KeyError, ValueError):
        return float("nan")
by = {}
for r in data:
    by.setdefault(r["Kernel Name"].split("(")[0][:60], []).append(r)
print("%-60s %6s %10s %8s %8s %9s" % ("kernel", "calls", "median us", "DRAM %", "occup. %", "MB/call"))
for name, rs in sorted(by.items(), key=lambda kv: -sum(num(r, "gpu__time_duration.sum") for r in kv[1])):
    med = lambda k: statistics.median(num(r, k) for r in rs)
    print("%-60s %6d %10.1f %8.1f %8.1f %9.1f" % (name, len(rs), med("gpu__time_duration.sum") / 1e3,
          med("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
          med("sm__warps_active.avg.pct_of_peak_sustained_active"), med("dram__bytes.sum") / 1e6))
EOF
