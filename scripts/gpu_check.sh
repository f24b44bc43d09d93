#!/usr/bin/env bash
# GPU correctness check (run on a machine with an NVIDIA GPU): for every variant, one micro-batch's debug state
# (logits, loss, every parameter gradient) from the CPU reference, the FP32 CUDA build and the BF16 CUDA build,
# compared with `test_pdn --compare` (fp32: 1e-4 of each tensor's scale; bf16: 5e-2 relative L2); then 10 training
# steps on each, whose loss sequences are printed side by side. Prints a table last.
# Usage: scripts/gpu_check.sh [OUTDIR]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/pdn_gpu_check}
mkdir -p "$out"
make -s train_pdn test_pdn train_pdncu train_pdncu_fp32 || exit 1
declare -A shape=(
    [tiny]="-b 4 -t 100 --mqar-pairs 8"                                        # T = 100: a partial chunk
    [340m-layer]="--n-layer 2 --vocab 512 -b 2 -t 256 -d 512"                  # K = V = 128, d = 1024, 4 chunks
)
rows=()
for size in tiny 340m-layer; do
    for v in dn pdn gdn pgdn kda pkda pgdn+exact; do
        preset="${v%+exact}-${size%-layer}"
        extra=""; [ "$v" = "pgdn+exact" ] && extra="--precond exact"
        [ "$v" = "pgdn+exact" ] && [ "$size" != tiny ] && continue
        f="$out/$v.$size"
        for bin in train_pdn train_pdncu_fp32 train_pdncu; do
            ./$bin --preset $preset $extra ${shape[$size]} --debug-state "$f.$bin.bin" > /dev/null 2>&1 || echo "FAILED: $bin $v $size"
        done
        r32=$(./test_pdn --compare "$f.train_pdn.bin" "$f.train_pdncu_fp32.bin" | tail -1 | cut -d: -f1)
        r16=$(./test_pdn --compare "$f.train_pdn.bin" "$f.train_pdncu.bin" | tail -1 | cut -d: -f1)
        w32=$(./test_pdn --compare "$f.train_pdn.bin" "$f.train_pdncu_fp32.bin" | awk '$5 ~ /ok|FAIL/ && $3+0 > m { m = $3 + 0 } END { printf "%.1e", m }')
        w16=$(./test_pdn --compare "$f.train_pdn.bin" "$f.train_pdncu.bin" | awk '$5 ~ /ok|FAIL/ && $4+0 > m { m = $4 + 0 } END { printf "%.1e", m }')
        rows+=("$(printf "%-11s %-11s | fp32 %-4s (worst max-rel %s) | bf16 %-4s (worst L2 %s)" "$v" "$size" "$r32" "$w32" "$r16" "$w16")")
    done
done
for bin in train_pdn train_pdncu_fp32 train_pdncu; do
    ./$bin --preset pgdn-tiny -x 10 -v 0 -m 1 -o "$out/run10.$bin" > /dev/null 2>&1 || echo "FAILED: $bin run10"
done
echo "10 training steps, pgdn-tiny (loss per step: CPU / GPU fp32 / GPU bf16):"
paste <(grep -o 'trl:[0-9.e-]*' "$out/run10.train_pdn/main.log") <(grep -o 'trl:[0-9.e-]*' "$out/run10.train_pdncu_fp32/main.log") \
      <(grep -o 'trl:[0-9.e-]*' "$out/run10.train_pdncu/main.log")
echo "debug-state comparison against the CPU reference:"
printf '%s\n' "${rows[@]}"
