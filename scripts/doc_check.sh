#!/usr/bin/env bash
# GPU check of packed documents (--doc-mask 1, issue 18), on a machine with an NVIDIA GPU. One window of text whose
# documents start at a chunk's first, second and last rows, three in a row and mid-chunk, with chunks that hold none
# (scripts/doc_shard.sh grid), through the CPU reference, the FP32 and the BF16 CUDA builds: one micro-batch's debug
# state (logits, loss, every parameter gradient) compared with `test_pdn --compare` (fp32: 1e-4 of each tensor's scale;
# bf16: 5e-2 relative L2), every variant and the exact preconditioner, at chunks of 64 and 32 and the 1b KDA's heads of
# 120; a control row (the GPU without --doc-mask against the CPU with it) that must FAIL; --doc-mask 1 on a window
# without boundaries = --doc-mask 0 byte for byte; --recompute 1 and 32-column scan blocks bit for bit; 20 training
# steps side by side and a bit-exact resume. Prints a table and a verdict last; exit code 1 if anything failed.
# Usage: scripts/doc_check.sh [OUTDIR]        (scripts/gpu_check.sh runs it too; VARIANTS="kda pkda": only those
# variants' rows, as in gpu_check.sh; the control row is pgdn's)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/pdn_doc_check}
mkdir -p "$out"
make -s train_pdn test_pdn train_pdncu train_pdncu_fp32 || exit 1
nfailed=0
failed() { echo "FAILED: $*"; nfailed=$((nfailed + 1)); }
want() { [ -z "${VARIANTS:-}" ] || [[ " ${VARIANTS//,/ } " == *" ${1%%+*} "* ]]; } # as gpu_check.sh's
docs="--doc-mask 1 --eot-id 0"
declare -A shape=(
    [tiny]="-b 4 -t 100"                                     # T = 100: a partial chunk
    [340m-layer]="--n-layer 2 --vocab 512 -b 2 -t 256 -d 512"       # K = V = 128, d = 1024, 4 chunks a row
    [340m-chunk32]="--n-layer 2 --vocab 512 -b 2 -t 200 -d 400 --chunk 32"
    [1b-layer]="--n-layer 1 --vocab 512 -b 2 -t 200 -d 400"         # d = 1792, 14 heads; kda: K = V = 120
)
declare -A grid=([tiny]="4 100 64 64" [340m-layer]="2 256 64 512" [340m-chunk32]="2 200 32 512" [1b-layer]="2 200 64 512")
declare -A size_preset=([tiny]=tiny [340m-layer]=340m [340m-chunk32]=340m [1b-layer]=1b)
for size in tiny 340m-layer 340m-chunk32 1b-layer; do
    scripts/doc_shard.sh "$out/grid_$size.train_000.bin" grid ${grid[$size]}
done
data() { echo "-i $out/grid_$1.train_*.bin"; }
verdict() { ./test_pdn --compare "$1" "$2" | tail -1 | cut -d: -f1; }
rows=()
for size in tiny 340m-layer 340m-chunk32 1b-layer; do
    for v in dn pdn gdn pgdn kda pkda pgdn+exact; do
        want $v || continue
        [ "$size" = 1b-layer ] && [ "$v" != gdn ] && [ "$v" != kda ] && [ "$v" != pkda ] && continue
        [ "$v" = "pgdn+exact" ] && [ "$size" != tiny ] && continue
        preset="${v%%+*}-${size_preset[$size]}"
        extra=""; [ "$v" = "pgdn+exact" ] && extra="--precond exact"
        f="$out/$v.$size"
        for bin in train_pdn train_pdncu_fp32 train_pdncu; do
            ./$bin --preset $preset $extra ${shape[$size]} $(data $size) $docs --debug-state "$f.$bin.bin" > "$f.$bin.txt" 2>&1 ||
                failed "$bin $v $size"
        done
        r32=$(verdict "$f.train_pdn.bin" "$f.train_pdncu_fp32.bin")
        r16=$(verdict "$f.train_pdn.bin" "$f.train_pdncu.bin")
        w32=$(./test_pdn --compare "$f.train_pdn.bin" "$f.train_pdncu_fp32.bin" | awk '$5 ~ /ok|FAIL/ && $3+0 > m { m = $3 + 0 } END { printf "%.1e", m }')
        w16=$(./test_pdn --compare "$f.train_pdn.bin" "$f.train_pdncu.bin" | awk '$5 ~ /ok|FAIL/ && $4+0 > m { m = $4 + 0 } END { printf "%.1e", m }')
        [ "$r32" = PASS ] && [ "$r16" = PASS ] || failed "$v $size against the CPU"
        rows+=("$(printf "%-11s %-12s | fp32 %-4s (worst max-rel %s) | bf16 %-4s (worst L2 %s)" "$v" "$size" "$r32" "$w32" "$r16" "$w16")")
    done
done
# control: the same window on the GPU without --doc-mask must not pass against the CPU with it (the documents matter
# at the comparison's tolerance)
f="$out/pgdn.340m-layer"
if want pgdn; then
    ./train_pdncu_fp32 --preset pgdn-340m ${shape[340m-layer]} $(data 340m-layer) --debug-state "$f.nodocs.bin" > /dev/null 2>&1 ||
        failed "train_pdncu_fp32 pgdn without --doc-mask"
    r=$(verdict "$f.train_pdn.bin" "$f.nodocs.bin")
    [ "$r" = FAIL ] || failed "the control row passed: the window's documents change nothing at the tolerance"
    rows+=("$(printf "%-11s %-12s | fp32 without --doc-mask against the CPU with it: %s (want FAIL)" pgdn 340m-layer "$r")")
fi

# exact rows: --doc-mask 1 on a window without an end-of-text (every mask multiplies by 1 or skips nothing) against
# --doc-mask 0, and the bit-for-bit switches (--recompute 1, 32-column scan blocks where the plan takes 16) with
# documents, each byte for byte
exact_rows=()
scripts/doc_shard.sh "$out/plain.train_000.bin" plain 513 512
same() { cmp -s "$1" "$2" && echo "bit-exact" || echo "DIFFERENT"; }
for v in dn pgdn kda pkda; do
    want $v || continue
    for bin in train_pdncu_fp32 train_pdncu; do
        g="$out/plain.$v.$bin"
        ./$bin --preset $v-340m ${shape[340m-layer]} -i "$out/plain.train_*.bin" --debug-state "$g.0.bin" > /dev/null 2>&1 || failed "$bin $v plain"
        ./$bin --preset $v-340m ${shape[340m-layer]} -i "$out/plain.train_*.bin" $docs --debug-state "$g.1.bin" > /dev/null 2>&1 ||
            failed "$bin $v plain --doc-mask 1"
        s=$(same "$g.0.bin" "$g.1.bin"); [ "$s" = bit-exact ] || failed "$bin $v: --doc-mask 1 without boundaries"
        exact_rows+=("$(printf "%-6s %-17s --doc-mask 1 on a window without boundaries vs --doc-mask 0: %s" "$v" "$bin" "$s")")
    done
done
for v in pgdn pkda; do
    want $v || continue
    for bin in train_pdncu_fp32 train_pdncu; do
        f="$out/$v.340m-layer"
        ./$bin --preset $v-340m ${shape[340m-layer]} $(data 340m-layer) $docs --recompute 1 --debug-state "$f.$bin.rc.bin" > /dev/null 2>&1 ||
            failed "$bin $v --recompute 1"
        s=$(same "$f.$bin.bin" "$f.$bin.rc.bin"); [ "$s" = bit-exact ] || failed "$bin $v --recompute 1 with documents"
        exact_rows+=("$(printf "%-6s %-17s with documents, --recompute 1 vs 0: %s" "$v" "$bin" "$s")")
    done
done
for v in dn pgdn kda pkda; do
    want $v || continue
    f="$out/$v.340m-layer"
    PDN_SCAN_BV=32 ./train_pdncu --preset $v-340m ${shape[340m-layer]} $(data 340m-layer) $docs --debug-state "$f.bv32.bin" > /dev/null 2>&1 ||
        failed "train_pdncu $v PDN_SCAN_BV=32"
    s=$(same "$f.train_pdncu.bin" "$f.bv32.bin"); [ "$s" = bit-exact ] || failed "train_pdncu $v 32-column scans with documents"
    exact_rows+=("$(printf "%-6s %-17s with documents, 32-column scan blocks vs the plan's 16: %s" "$v" train_pdncu "$s")")
done

# training: 20 steps on documents of 1..79 tokens on each trainer (losses side by side), and on the GPU a resume at
# step 10 against the uninterrupted run (the models, the state files and the losses)
scripts/doc_shard.sh "$out/len.train_000.bin" lengths 60000 64 40
tflags="--preset pgdn-tiny -i $out/len.train_*.bin -b 4 -t 128 -x 20 -n 10 -v 0 -m 1 $docs"
for bin in train_pdn train_pdncu_fp32 train_pdncu; do
    rm -rf "$out/run.$bin" "$out/run.$bin.r"
    ./$bin $tflags -o "$out/run.$bin" > /dev/null 2>&1 || failed "$bin 20 steps with documents"
done
for bin in train_pdncu_fp32 train_pdncu; do
    mkdir -p "$out/run.$bin.r" && cp "$out/run.$bin/"*_00000010.bin "$out/run.$bin.r/"
    ./$bin $tflags -o "$out/run.$bin.r" -y 1 > /dev/null 2>&1 || failed "$bin resume with documents"
    s=$(cmp -s "$out/run.$bin/model_00000020.bin" "$out/run.$bin.r/model_00000020.bin" &&
        cmp -s "$out/run.$bin/state_00000020.bin" "$out/run.$bin.r/state_00000020.bin" &&
        [ "$(grep -o 's:1[1-9] trl:[^ ]*\|s:20 trl:[^ ]*' "$out/run.$bin/main.log")" = \
          "$(grep -o 's:1[1-9] trl:[^ ]*\|s:20 trl:[^ ]*' "$out/run.$bin.r/main.log")" ] && echo bit-exact || echo DIFFERENT)
    [ "$s" = bit-exact ] || failed "$bin resume with documents"
    exact_rows+=("$(printf "%-6s %-17s with documents, resume at step 10 vs uninterrupted (model, state, losses): %s" pgdn-tiny "$bin" "$s")")
done

echo "20 training steps with --doc-mask 1, pgdn-tiny (loss per step: CPU / GPU fp32 / GPU bf16):"
paste <(grep -o 'trl:[0-9.e-]*' "$out/run.train_pdn/main.log") <(grep -o 'trl:[0-9.e-]*' "$out/run.train_pdncu_fp32/main.log") \
      <(grep -o 'trl:[0-9.e-]*' "$out/run.train_pdncu/main.log")
echo "exact: no boundaries, --recompute 1, the scans' value columns, resume (all with --doc-mask 1):"
printf '%s\n' "${exact_rows[@]}"
echo "packed documents, debug state against the CPU reference:"
printf '%s\n' "${rows[@]}"
if [ $nfailed -gt 0 ]; then echo "doc_check: $nfailed FAILED"; exit 1; fi
echo "doc_check: all PASS${VARIANTS:+ (the variant rows of ${VARIANTS//,/ } only)}"
