#!/usr/bin/env bash
# GPU throughput benchmark (issue 4): end-to-end training tokens/s, ms per step, MFU and device memory for every
# variant at its 340m preset with micro-batch 16 x 2048 tokens (one micro-batch per optimizer step; the first step
# is not timed), then where the time goes for PGDN (PDN_PROFILE=1), then the mixer kernels alone from the kernel lab
# (dev/cuda/delta_chunk: B = 1, H = 8, K = V = 128, T = 2048 ... 16384). Prints tables; run on an NVIDIA GPU.
# Usage: scripts/bench_gpu.sh [steps]     (SKIP_LAB=1: without the kernel-lab table)
set -uo pipefail
cd "$(dirname "$0")/.."
steps=${1:-6}
make -s train_pdncu || exit 1
rows=()
for v in dn pdn gdn pgdn kda pkda; do
    log=$(./train_pdncu --preset $v-340m -b 16 -t 2048 -d 32768 -x "$steps" -v 0 -m 1 2>&1)
    tps=$(echo "$log" | sed -n 's/.*; \([0-9]*\) tok\/s averaged.*/\1/p')
    mem=$(echo "$log" | sed -n 's/.*device memory in use \([0-9.]*\) GiB.*/\1/p')
    ms=$(echo "$log" | awk '/^step/ { for (i = 1; i <= NF; i++) if ($i == "ms") v = $(i-1) } END { print v }')
    mfu=$(echo "$log" | awk '/^step/ { for (i = 1; i <= NF; i++) if ($i == "MFU") v = $(i-1) } END { print v }')
    rows+=("$(printf "%-6s | %9s tok/s | %8s ms/step | %6s MFU | %6s GiB" "$v" "$tps" "$ms" "$mfu" "$mem")")
done
echo "== where the time goes, pgdn-340m, 16 x 2048 tokens per step =="
PDN_PROFILE=1 ./train_pdncu --preset pgdn-340m -b 16 -t 2048 -d 32768 -x "$steps" -v 0 -m 1 2>&1 | sed -n '/where the time goes/,/total/p'
if [ -f dev/cuda/Makefile ] && [ -z "${SKIP_LAB:-}" ]; then
    echo "== mixer kernels alone (dev/cuda/delta_chunk) =="
    make -s -C dev/cuda delta_chunk > /dev/null && (cd dev/cuda && ./delta_chunk 2>&1 | tail -30)
fi
echo "== end to end, 340m presets, micro-batch 16 x 2048, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%Y-%m-%d) =="
printf '%s\n' "${rows[@]}"
