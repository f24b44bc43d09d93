#!/usr/bin/env bash
# Where one training step's GPU time goes, per kernel (finer than PDN_PROFILE=1's regions): runs train_pdncu under
# Nsight Compute for 3 steps of a model with few layers at a preset's shape, timing every kernel launch
# (gpu__time_duration.sum only; the clocks are left alone), finds the repeating launch sequence of one step at the end
# of the run, and prints that step's kernels summed by name (and launch shape), largest first. Multiply the per-layer
# kernels by (the preset's layers / LAYERS) for the full model. Needs an NVIDIA GPU whose counters ncu can read.
# Usage: scripts/profile_kernels.sh [preset] [layers] [rows]   (defaults: gdn-340m 2 40; CSV kept in $OUT or /tmp)
# B=1 T=16384 scripts/profile_kernels.sh ...: another micro-batch shape (default 16 x 2048; long sequences, few blocks)
set -uo pipefail
cd "$(dirname "$0")/.."
preset=${1:-gdn-340m}
layers=${2:-2}
rows=${3:-40}
bsz=${B:-16}
seq=${T:-2048}
command -v ncu > /dev/null || { echo "profile_kernels: ncu (Nsight Compute) not found" >&2; exit 1; }
make -s train_pdncu || exit 1
csv=${OUT:-/tmp}/ncu_${preset}_${layers}l_${bsz}x${seq}.csv
ncu --clock-control none --metrics gpu__time_duration.sum --csv ./train_pdncu --preset "$preset" --n-layer "$layers" \
    -b "$bsz" -t "$seq" -d 0 -x 3 -v 0 -m 1 > "$csv" 2> "$csv.err" || { tail -20 "$csv.err" >&2; exit 1; }
python3 - "$csv" "$rows" "$preset" "$layers" "$bsz x $seq" <<'EOF'
import csv, re, sys
path, rows, preset, layers, shape = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
recs = []
for r in csv.reader(open(path)):
    if len(r) == 15 and r[12] == "gpu__time_duration.sum":
        name = re.sub(r"\(.*", "", r[4]).replace("void ", "")
        unit = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(r[13], 1e-3)
        recs.append((name, r[7], r[8], float(r[14].replace(",", "")) * unit))
names = [x[0] for x in recs]
n = len(names)
# the step is the shortest period M with the last M launches repeating the M before them
step = next((m for m in range(10, n // 2 + 1) if names[n - m:] == names[n - 2 * m:n - m]), 0)
if not step:
    sys.exit("profile_kernels: no repeating step found in %d launches" % n)
agg = {}
for name, blk, grid, us in recs[n - step:]:
    a = agg.setdefault((name, blk, grid), [0.0, 0])
    a[0] += us
    a[1] += 1
total = sum(a[0] for a in agg.values())
print("kernels of one step, %s with %s layers, %s: %d launches, %.2f ms of kernel time" % (preset, layers, shape, step, total / 1e3))
print("%10s %6s %9s %6s  %s" % ("us", "calls", "us/call", "share", "kernel (block) (grid)"))
for (name, blk, grid), (us, c) in sorted(agg.items(), key=lambda x: -x[1][0])[:rows]:
    print("%10.1f %6d %9.1f %5.1f%%  %s %s %s" % (us, c, us / c, 100 * us / total, name[:70], blk, grid))
EOF
