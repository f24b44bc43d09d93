#!/usr/bin/env bash
# GPU throughput and memory benchmark (issue 13): end-to-end training tokens/s, ms per step, MFU and device memory
# (cudaMemGetInfo after the run: everything the process holds). The language-model rows train on a token shard of
# uniform random tokens below the preset's vocabulary (32,000), so that every position has a target and the
# classifier does its full work, as in pre-training (the default MQAR job has targets at its answers only, and the
# trainer runs the classifier on those rows alone). Rows:
#   - every variant at its 340m preset, micro-batch 16 x 2048 tokens (one micro-batch per optimizer step);
#   - pgdn-340m at 4 x 8192 and 1 x 32768 tokens (long sequences, small batches);
#   - pgdn-340m-hybrid (issue 19: attention at layers 5, 11, 17, 23, 8 heads of 128) at 16 x 2048 and 4 x 8192, and
#     kda-340m with attention at the same layers, 16 heads of 64 on 4 kv heads (grouped-query: the cuDNN backward
#     through repeated K, V);
#   - gdn, pgdn, kda, pkda at their 1b presets, 8 x 2048 (kda/pkda-1b: head size 120), and pgdn-1b at 16 x 2048 with
#     --recompute 1 (each layer's forward run again in the backward);
#   - the MQAR sweep's model (issue 15: 2 layers, d 128, 4 heads of 32, vocab 8192, Zoology's L 256 N 32, 128
#     sequences a step), alone on the GPU, with where its time goes (PDN_PROFILE=1);
# then where the time goes for pgdn-340m at 16 x 2048 and at 1 x 32768 (PDN_PROFILE=1) and the mixer kernels alone
# under the trainer's plan for each shape (dev/cuda/delta_chunk v11: B = 1, H = 8, K = V = 128, T = 2048 ... 16384,
# and B = 16, T = 2048). The first step of every run is not timed.
# OLD=DIR: also run DIR/train_pdncu (an older build) on the 340m rows, side by side in the same job.
# Usage: scripts/bench_gpu.sh [steps]     (SKIP_LAB=1: no kernel-lab table; QUICK=1: the 340m 16 x 2048 rows only)
set -uo pipefail
cd "$(dirname "$0")/.."
steps=${1:-6}
make -s train_pdncu || exit 1
data=$(mktemp -d /tmp/pdn_bench_XXXXXX)
trap 'rm -rf "$data"' EXIT
scripts/random_shard.sh "$data/rand_train_000.bin" || exit 1
lm=(-i "$data/rand_train_*.bin")
rows=()
# row LABEL BINARY ARGS...: one run, one table row
row() {
    local label=$1 bin=$2; shift 2
    local log tps mem ms mfu
    log=$("$bin" "$@" -x "$steps" -v 0 -m 1 2>&1)
    tps=$(echo "$log" | sed -n 's/.*; \([0-9]*\) tok\/s averaged.*/\1/p')
    mem=$(echo "$log" | sed -n 's/.*device memory in use \([0-9.]*\) GiB.*/\1/p')
    ms=$(echo "$log" | awk '/^step/ { for (i = 1; i <= NF; i++) if ($i == "ms") v = $(i-1) } END { print v }')
    mfu=$(echo "$log" | awk '/^step/ { for (i = 1; i <= NF; i++) if ($i == "MFU") v = $(i-1) } END { print v }')
    [ -n "$tps" ] || { tps="FAILED"; echo "$log" | tail -5 >&2; }
    rows+=("$(printf "%-30s | %9s tok/s | %8s ms/step | %6s MFU | %6s GiB" "$label" "$tps" "$ms" "$mfu" "$mem")")
    echo "${rows[-1]}" # as it comes (the table is printed again at the end)
}
for v in dn pdn gdn pgdn kda pkda; do
    row "$v-340m 16x2048" ./train_pdncu --preset $v-340m "${lm[@]}" -b 16 -t 2048 -d 32768
    if [ -n "${OLD:-}" ]; then row "  (OLD build)" "$OLD/train_pdncu" --preset $v-340m "${lm[@]}" -b 16 -t 2048 -d 32768; fi
done
row "pgdn-340m-hybrid 16x2048" ./train_pdncu --preset pgdn-340m-hybrid "${lm[@]}" -b 16 -t 2048 -d 32768
row "kda-340m + GQA attn 16x2048" ./train_pdncu --preset kda-340m "${lm[@]}" --attn-layers 5,11,17,23 --attn-heads 16 \
    --attn-kv-heads 4 -b 16 -t 2048 -d 32768
if [ -z "${QUICK:-}" ]; then
    row "pgdn-340m-hybrid 4x8192" ./train_pdncu --preset pgdn-340m-hybrid "${lm[@]}" -b 4 -t 8192 -d 32768
    row "pgdn-340m 4x8192" ./train_pdncu --preset pgdn-340m "${lm[@]}" -b 4 -t 8192 -d 32768
    row "pgdn-340m 1x32768" ./train_pdncu --preset pgdn-340m "${lm[@]}" -b 1 -t 32768 -d 32768
    for v in gdn pgdn kda pkda; do
        row "$v-1b 8x2048" ./train_pdncu --preset $v-1b "${lm[@]}" -b 8 -t 2048 -d 16384
    done
    row "pgdn-1b 16x2048 --recompute 1" ./train_pdncu --preset pgdn-1b "${lm[@]}" -b 16 -t 2048 -d 32768 --recompute 1
    row "pgdn-340m 16x2048 --recompute 1" ./train_pdncu --preset pgdn-340m "${lm[@]}" -b 16 -t 2048 -d 32768 --recompute 1
    mqar=(--preset pgdn-tiny --n-layer 2 --d-model 128 --n-head 4 --head-dim 32 --vocab 8192 --tie 1 --mqar-gen zoology
          --mqar-vocab 8192 --mqar-pairs 32 -t 256 -b 128 --mqar-test 1000)
    row "mqar pgdn d128 L256 x 128" ./train_pdncu "${mqar[@]}"
    echo "== where the time goes, the MQAR sweep's pgdn (d 128, 4 heads of 32), 128 x 256 tokens per step =="
    PDN_PROFILE=1 ./train_pdncu "${mqar[@]}" -x "$steps" -v 0 -m 1 2>&1 | sed -n '/where the time goes/,/total/p'
    echo "== where the time goes, pgdn-340m, 16 x 2048 tokens per step =="
    PDN_PROFILE=1 ./train_pdncu --preset pgdn-340m "${lm[@]}" -b 16 -t 2048 -d 32768 -x "$steps" -v 0 -m 1 2>&1 | sed -n '/where the time goes/,/total/p'
    echo "== where the time goes, pgdn-340m, 1 x 32768 tokens per step (what the long-sequence target loses) =="
    PDN_PROFILE=1 ./train_pdncu --preset pgdn-340m "${lm[@]}" -b 1 -t 32768 -d 32768 -x "$steps" -v 0 -m 1 2>&1 | sed -n '/where the time goes/,/total/p'
fi
if [ -f dev/cuda/Makefile ] && [ -z "${SKIP_LAB:-}" ]; then
    echo "== mixer kernels alone, the trainer's plan (dev/cuda/delta_chunk v11) =="
    make -s -C dev/cuda delta_chunk > /dev/null && (cd dev/cuda && ./delta_chunk 11 --no-validate 2>&1 | sed -n "/=== timing/,\$p")
fi
echo "== end to end, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%Y-%m-%d), $steps steps (the first untimed) =="
printf '%s\n' "${rows[@]}"
