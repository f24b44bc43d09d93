#!/usr/bin/env bash
# GPU correctness check (run on a machine with an NVIDIA GPU): for every variant, one micro-batch's debug state
# (logits, loss, every parameter gradient) from the CPU reference, the FP32 CUDA build and the BF16 CUDA build,
# compared with `test_pdn --compare` (fp32: 1e-4 of each tensor's scale; bf16: 5e-2 relative L2); --recompute 1
# against the normal run (bit for bit); then 10 training steps on each, whose loss sequences are printed side by
# side; checkpoints and resume. Hybrids (issue 19): pgdn+attn (attention at layer 1: tiny with 1 kv head and a
# 40-token window, the 340m layer with 8 heads of 128) and kda+attn-gqa (attention at layer 0, 16 heads of 64 on 4 kv
# heads at 340m) in the same rows, and greedy generation through the KV cache; packed documents (--doc-mask 1) by
# scripts/doc_check.sh, whose rows come first. Prints a table last.
# Usage: scripts/gpu_check.sh [OUTDIR]     VARIANTS="kda pkda": only those variants' rows (with their hybrids), here and
# in doc_check.sh; the rows that train pgdn-tiny (text, checkpoints, generation, signals) run whatever it says
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/pdn_gpu_check}
mkdir -p "$out"
# want V: whether VARIANTS (space or comma separated, empty: all) holds V's variant (pgdn+attn is pgdn's)
want() { [ -z "${VARIANTS:-}" ] || [[ " ${VARIANTS//,/ } " == *" ${1%%+*} "* ]]; }
[ -z "${VARIANTS:-}" ] || echo "gpu_check: the variant rows of ${VARIANTS//,/ } only"
make -s train_pdn test_pdn train_pdncu train_pdncu_fp32 || exit 1
nfailed=0 # commands that failed (a row then has no result), counted into the verdict at the end
failed() { echo "FAILED: $*"; nfailed=$((nfailed + 1)); }
declare -A shape=(
    [tiny]="-b 4 -t 100 --mqar-pairs 8"                                        # T = 100: a partial chunk
    [340m-layer]="--n-layer 2 --vocab 512 -b 2 -t 256 -d 512"                  # K = V = 128, d = 1024, 4 chunks
    [340m-chunk32]="--n-layer 2 --vocab 512 -b 2 -t 200 -d 400 --chunk 32"     # the GPU kernels at another chunk size
    [1b-layer]="--n-layer 1 --vocab 512 -b 1 -t 200 -d 200"                     # d = 1792, 14 heads; kda: K = V = 120
)
declare -A size_preset=([tiny]=tiny [340m-layer]=340m [340m-chunk32]=340m [1b-layer]=1b)
rows=()
for size in tiny 340m-layer 340m-chunk32 1b-layer; do
    for v in dn pdn gdn pgdn kda pkda pgdn+exact pgdn+attn kda+attn-gqa; do
        want $v || continue
        [ "$size" = 1b-layer ] && [ "$v" != gdn ] && [ "$v" != kda ] && [ "$v" != pkda ] && continue
        preset="${v%%+*}-${size_preset[$size]}"
        extra=""; [ "$v" = "pgdn+exact" ] && extra="--precond exact"
        [ "$v" = "pgdn+exact" ] && [ "$size" != tiny ] && continue
        if [ "$v" = "pgdn+attn" ]; then
            extra="--attn-layers 1"; [ "$size" = tiny ] && extra="--attn-layers 1 --attn-kv-heads 1 --attn-window 40"
        fi
        if [ "$v" = "kda+attn-gqa" ]; then
            [ "$size" = tiny ] && continue
            extra="--attn-layers 0 --attn-heads 16 --attn-kv-heads 4"
        fi
        f="$out/$v.$size"
        for bin in train_pdn train_pdncu_fp32 train_pdncu; do
            ./$bin --preset $preset $extra ${shape[$size]} --debug-state "$f.$bin.bin" > /dev/null 2>&1 || failed "$bin $v $size"
        done
        r32=$(./test_pdn --compare "$f.train_pdn.bin" "$f.train_pdncu_fp32.bin" 2>/dev/null | tail -1 | cut -d: -f1)
        r16=$(./test_pdn --compare "$f.train_pdn.bin" "$f.train_pdncu.bin" 2>/dev/null | tail -1 | cut -d: -f1)
        r32=${r32:-MISSING} r16=${r16:-MISSING} # no verdict (a run failed): a problem in the count below
        w32=$(./test_pdn --compare "$f.train_pdn.bin" "$f.train_pdncu_fp32.bin" 2>/dev/null | awk '$5 ~ /ok|FAIL/ && $3+0 > m { m = $3 + 0 } END { printf "%.1e", m }')
        w16=$(./test_pdn --compare "$f.train_pdn.bin" "$f.train_pdncu.bin" 2>/dev/null | awk '$5 ~ /ok|FAIL/ && $4+0 > m { m = $4 + 0 } END { printf "%.1e", m }')
        rows+=("$(printf "%-11s %-11s | fp32 %-4s (worst max-rel %s) | bf16 %-4s (worst L2 %s)" "$v" "$size" "$r32" "$w32" "$r16" "$w16")")
    done
done
# text: the same batch of token shards through both trainers (a 512-token BPE learned from this repository's docs)
make -s dev/data/train_bpe dev/data/prepare_shards || exit 1
./dev/data/train_bpe --vocab-size 512 --out-dir "$out/tok" --quiet 1 README.md dev/data/README.md > /dev/null
./dev/data/prepare_shards --tokenizer "$out/tok/tokenizer.bin" --out "$out/text/docs" --val-tokens 2000 --quiet 1 \
    README.md dev/data/README.md > /dev/null
for bin in train_pdn train_pdncu_fp32 train_pdncu; do
    ./$bin --preset pgdn-tiny -i "$out/text/docs_train_*.bin" --tokenizer "$out/tok/tokenizer.bin" -b 4 -t 100 \
        --debug-state "$out/text.$bin.bin" > /dev/null 2>&1 || failed "$bin text debug state"
done
r32=$(./test_pdn --compare "$out/text.train_pdn.bin" "$out/text.train_pdncu_fp32.bin" 2>/dev/null | tail -1 | cut -d: -f1)
r16=$(./test_pdn --compare "$out/text.train_pdn.bin" "$out/text.train_pdncu.bin" 2>/dev/null | tail -1 | cut -d: -f1)
r32=${r32:-MISSING} r16=${r16:-MISSING}
rows+=("$(printf "%-11s %-11s | fp32 %-4s | bf16 %-4s" "pgdn" "text" "$r32" "$r16")")

for bin in train_pdn train_pdncu_fp32 train_pdncu; do
    ./$bin --preset pgdn-tiny -x 10 -v 0 -m 1 -o "$out/run10.$bin" > /dev/null 2>&1 || failed "$bin run10"
done

# Checkpoints across runs and devices, 12 steps of 2 accumulated micro-batches, checkpoints at 6 and 12.
# (1) resume on the GPU reproduces the uninterrupted run bit for bit (bf16 too: the stochastic-rounding seeds depend
# only on the step); (2) a CPU checkpoint continues on the GPU (fp32 build) and a GPU one on the CPU, and steps 7-12
# match the other trainer's uninterrupted run to fp32 rounding (max relative difference printed).
flags="--preset pgdn-tiny -b 8 -t 64 -d 1024 -x 12 -n 6 -v 0 -m 1"
losses() { grep -o '^s:\([7-9]\|1[0-2]\) trl:[0-9.e-]*' "$1/main.log"; }
# the max relative difference of two runs' losses at steps 7-12 (MISSING where either run has none or fewer)
maxrel() { paste <(losses "$1" | cut -d: -f3) <(losses "$2" | cut -d: -f3) | awk -F'\t' '
    $1 == "" || $2 == "" { bad = 1; next }
    { n++; d = $1 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > m) m = r }
    END { if (bad || n != 6) print "MISSING"; else printf "%.1e", m }'; }
resume_rows=()
for bin in train_pdn train_pdncu train_pdncu_fp32; do
    rm -rf "$out/ck.$bin."*
    ./$bin $flags -o "$out/ck.$bin.a" > /dev/null 2>&1 || failed "$bin checkpoint run"
done
for bin in train_pdncu train_pdncu_fp32; do
    mkdir -p "$out/ck.$bin.b" && cp "$out/ck.$bin.a/"*_00000006.bin "$out/ck.$bin.b/"
    ./$bin $flags -o "$out/ck.$bin.b" -y 1 > /dev/null 2>&1 || failed "$bin resume"
    same=$(cmp -s "$out/ck.$bin.a/model_00000012.bin" "$out/ck.$bin.b/model_00000012.bin" && [ "$(losses "$out/ck.$bin.a")" = "$(losses "$out/ck.$bin.b")" ] && echo "bit-exact" || echo "DIFFERENT")
    resume_rows+=("$(printf "%-18s resume at step 6 vs uninterrupted: %s" "$bin" "$same")")
done
mkdir -p "$out/ck.cpu2gpu" && cp "$out/ck.train_pdn.a/"*_00000006.bin "$out/ck.cpu2gpu/"
./train_pdncu_fp32 $flags -o "$out/ck.cpu2gpu" -y 1 > /dev/null 2>&1 || failed "CPU -> GPU resume"
resume_rows+=("$(printf "%-18s CPU checkpoint continued on the GPU (fp32): steps 7-12 vs the CPU run, max rel %s" "cpu -> gpu" "$(maxrel "$out/ck.cpu2gpu" "$out/ck.train_pdn.a")")")
mkdir -p "$out/ck.gpu2cpu" && cp "$out/ck.train_pdncu_fp32.a/"*_00000006.bin "$out/ck.gpu2cpu/"
./train_pdn $flags -o "$out/ck.gpu2cpu" -y 1 > /dev/null 2>&1 || failed "GPU -> CPU resume"
resume_rows+=("$(printf "%-18s GPU checkpoint continued on the CPU: steps 7-12 vs the GPU fp32 run, max rel %s" "gpu -> cpu" "$(maxrel "$out/ck.gpu2cpu" "$out/ck.train_pdncu_fp32.a")")")
# --recompute 1 runs each layer's forward again in the backward from the same inputs with the same kernels: its
# gradients must be the normal run's bit for bit (every variant, both builds, the 340m-layer shape; the files hold no
# flag, so they compare byte for byte)
recompute_rows=()
for v in dn pdn gdn pgdn kda pkda pgdn+attn; do
    want $v || continue
    f="$out/$v.340m-layer"
    extra=""; [ "$v" = "pgdn+attn" ] && extra="--attn-layers 1"
    for bin in train_pdncu_fp32 train_pdncu; do
        ./$bin --preset ${v%%+*}-340m $extra ${shape[340m-layer]} --recompute 1 --debug-state "$f.$bin.recompute.bin" > /dev/null 2>&1 || failed "$bin $v --recompute 1"
        same=$(cmp -s "$f.$bin.bin" "$f.$bin.recompute.bin" && echo "bit-exact" || echo "DIFFERENT")
        recompute_rows+=("$(printf "%-6s %-18s --recompute 1 vs 0, logits and gradients: %s" "$v" "$bin" "$same")")
    done
done
# The backward's second stream (the MLP's and W_o's weight gradients beside the mixer's scan) is on at the 340m-layer
# shape (few blocks: bwd_side_for); PDN_BWD_SIDE=0 keeps everything on one stream: the same GEMMs, so bit for bit
for v in pgdn pkda pgdn+attn; do
    want $v || continue
    f="$out/$v.340m-layer"
    extra=""; [ "$v" = "pgdn+attn" ] && extra="--attn-layers 1"
    for bin in train_pdncu_fp32 train_pdncu; do
        PDN_BWD_SIDE=0 ./$bin --preset ${v%%+*}-340m $extra ${shape[340m-layer]} --debug-state "$f.$bin.oneside.bin" > /dev/null 2>&1 || failed "$bin $v PDN_BWD_SIDE=0"
        same=$(cmp -s "$f.$bin.bin" "$f.$bin.oneside.bin" && echo "bit-exact" || echo "DIFFERENT")
        recompute_rows+=("$(printf "%-6s %-18s one stream vs the backward's second stream, logits and gradients: %s" "$v" "$bin" "$same")")
    done
done
# The tensor-core scans' value columns a block: at the 340m-layer shape (2 x 8 heads of 128) the plan takes 16
# (scan_bv_for: few blocks on long chains); PDN_SCAN_BV=32 the 32-column blocks. The same 16 x 16 products, so bit for
# bit (bf16 build only: the fp32 build runs the SIMT scans)
for v in dn pgdn kda pkda; do
    want $v || continue
    f="$out/$v.340m-layer"
    PDN_SCAN_BV=32 ./train_pdncu --preset $v-340m ${shape[340m-layer]} --debug-state "$f.train_pdncu.bv32.bin" > /dev/null 2>&1 || failed "train_pdncu $v PDN_SCAN_BV=32"
    same=$(cmp -s "$f.train_pdncu.bin" "$f.train_pdncu.bv32.bin" && echo "bit-exact" || echo "DIFFERENT")
    recompute_rows+=("$(printf "%-6s %-18s 32-column scan blocks vs the plan's 16, logits and gradients: %s" "$v" "train_pdncu" "$same")")
done
# A run's robustness on the GPU (issue 17): (1) SIGTERM mid-run stops with exit 6 and a checkpoint, and -y 1 then
# reproduces the uninterrupted run bit for bit; (2) a checkpoint whose loss is finite but whose gradient norm is NaN
# (a_log_p x 1e8: exp overflows, 0 * inf in the backward) stops with exit 3 at step 1 with nothing written, and with
# --skip-nonfinite 3 the three steps are skipped and the checkpoints hold the loaded parameters unchanged.
robust_rows=()
nsteps() { local n; n=$(grep -c trl: "$1" 2>/dev/null); echo "${n:-0}"; }
rflags="--preset pgdn-tiny -b 4 -t 32 --mqar-pairs 4 -v 0 -m 1 -x 3000"
./train_pdn --preset pgdn-tiny -b 4 -t 32 --mqar-pairs 4 -v 0 -m 1 -x 1 -o "$out/rb.base" > /dev/null 2>&1
python3 - "$out/rb.base/model_00000001.bin" "$out/rb.alp.bin" <<'PY' || failed "editing the checkpoint (python3)"
import re, struct, sys, zlib
d = bytearray(open(sys.argv[1], 'rb').read())
hb = int(re.search(rb'header_bytes (\d+)', d).group(1))
m = re.search(rb'tensor a_log_p ([0-9x]+) offset (\d+)', d)
n, off = 1, int(m.group(2))
for k in m.group(1).split(b'x'):
    n *= int(k)
for i in range(n):
    p = hb + 4 * (off + i)
    d[p:p + 4] = struct.pack('<f', struct.unpack('<f', d[p:p + 4])[0] * 1e8)
c = d.index(b'crc32 ')
d[c + 6:c + 14] = b'%08x' % zlib.crc32(bytes(d[:c]) + bytes(d[hb:]))
open(sys.argv[2], 'wb').write(d)
PY
for bin in train_pdncu train_pdncu_fp32; do
    rm -rf "$out/rb.$bin."*
    ./$bin $rflags -o "$out/rb.$bin.a" > /dev/null 2>&1 || failed "$bin uninterrupted run"
    ./$bin $rflags -o "$out/rb.$bin.b" > "$out/rb.$bin.b.txt" 2>&1 &
    pid=$!
    while kill -0 $pid 2>/dev/null && [ "$(nsteps "$out/rb.$bin.b/main.log")" -lt 100 ]; do sleep 0.05; done
    kill -TERM $pid; wait $pid; rc=$?
    ./$bin $rflags -o "$out/rb.$bin.b" -y 1 > /dev/null 2>&1 || failed "$bin resume after SIGTERM"
    same=$(cmp -s "$out/rb.$bin.a/model_00003000.bin" "$out/rb.$bin.b/model_00003000.bin" && \
           cmp -s "$out/rb.$bin.a/state_00003000.bin" "$out/rb.$bin.b/state_00003000.bin" && \
           [ "$(grep -o 's:[0-9]* trl:[^ ]*' "$out/rb.$bin.a/main.log")" = "$(grep -o 's:[0-9]* trl:[^ ]*' "$out/rb.$bin.b/main.log")" ] \
           && echo "bit-exact" || echo "DIFFERENT")
    [ "$rc" = 6 ] || same="$same, WRONG EXIT"
    robust_rows+=("$(printf "%-18s SIGTERM: exit %s (want 6) at %s; resumed vs uninterrupted: %s" "$bin" "$rc" \
                  "$(grep -o 'after step [0-9]*' "$out/rb.$bin.b.txt")" "$same")")
    ./$bin --preset pgdn-tiny -b 4 -t 32 --mqar-pairs 4 -v 0 -m 1 -e "$out/rb.alp.bin" -x 3 -n 1 -o "$out/rb.$bin.nan" > "$out/rb.$bin.nan.txt" 2>&1
    rc=$?
    n=$(ls "$out/rb.$bin.nan" | grep -c '^model_')
    ./$bin --preset pgdn-tiny -b 4 -t 32 --mqar-pairs 4 -v 0 -m 1 -e "$out/rb.alp.bin" -x 3 -n 1 --skip-nonfinite 3 \
        -o "$out/rb.$bin.skip" > /dev/null 2>&1
    rc2=$?
    same=$([ -f "$out/rb.$bin.skip/model_00000003.bin" ] && cmp -s <(tail -c +4097 "$out/rb.alp.bin") \
           <(tail -c +4097 "$out/rb.$bin.skip/model_00000003.bin") && echo "unchanged" || echo "CHANGED")
    [ "$rc" = 3 ] && [ "$n" = 0 ] && [ "$rc2" = 0 ] || same="$same, WRONG EXIT OR CHECKPOINTS"
    robust_rows+=("$(printf "%-18s NaN gradient norm: exit %s (want 3), %s checkpoints (want 0); --skip-nonfinite 3: exit %s, parameters %s" \
                  "$bin" "$rc" "$n" "$rc2" "$same")")
done

# generation with the KV cache (hybrid) from a checkpoint trained on the CPU, 40 tokens sampled with one seed: the fp32
# GPU build must draw the CPU's tokens (only a draw within fp32 rounding of a boundary could differ); bf16 may differ
gen_rows=()
./train_pdn --preset pgdn-tiny --attn-layers 1 --attn-window 16 -b 4 -t 32 --mqar-pairs 4 -x 30 -v 0 -m 1 -o "$out/gen" > /dev/null 2>&1 || failed "hybrid training for generation"
gck=$(ls "$out/gen"/model_*.bin | tail -1)
for bin in train_pdn train_pdncu_fp32 train_pdncu; do
    ./$bin -e "$gck" --generate 40 --prompt "1 2 3 4 5" --seed 7 > "$out/gen.$bin.txt" 2>/dev/null || failed "$bin generation"
done
g32=$(cmp -s "$out/gen.train_pdn.txt" "$out/gen.train_pdncu_fp32.txt" && echo same || echo DIFFERENT)
g16=$(cmp -s "$out/gen.train_pdn.txt" "$out/gen.train_pdncu.txt" && echo same || echo different)
gen_rows+=("$(printf "hybrid (window 16, outgrown), 40 sampled tokens: fp32 GPU vs CPU %s; bf16 GPU vs CPU %s" "$g32" "$g16")")

# packed documents (--doc-mask 1, issue 18): scripts/doc_check.sh prints its own rows; a failure there is one here
echo "== packed documents: scripts/doc_check.sh =="
scripts/doc_check.sh "$out/docs" || failed "scripts/doc_check.sh (packed documents)"
echo "== the rows of gpu_check =="

echo "10 training steps, pgdn-tiny (loss per step: CPU / GPU fp32 / GPU bf16):"
paste <(grep -o 'trl:[0-9.e-]*' "$out/run10.train_pdn/main.log") <(grep -o 'trl:[0-9.e-]*' "$out/run10.train_pdncu_fp32/main.log") \
      <(grep -o 'trl:[0-9.e-]*' "$out/run10.train_pdncu/main.log")
echo "checkpoints and resume:"
printf '%s\n' "${resume_rows[@]}"
echo "recompute (activation checkpointing per layer), the backward's second stream, the scans' value columns:"
printf '%s\n' "${recompute_rows[@]}"
echo "debug-state comparison against the CPU reference:"
printf '%s\n' "${rows[@]}"
echo "generation (KV cache):"
printf '%s\n' "${gen_rows[@]}"
echo "a run's robustness (signals, non-finite steps):"
printf '%s\n' "${robust_rows[@]}"
# the verdict: any row that failed, differed or changed, or any command that failed, makes the exit code 1
bad=$nfailed
for r in "${resume_rows[@]}" "${recompute_rows[@]}" "${rows[@]}" "${gen_rows[@]}" "${robust_rows[@]}"; do
    case "$r" in *FAIL*|*DIFFERENT*|*CHANGED*|*WRONG*|*MISSING*) bad=$((bad + 1)) ;; esac
done
if [ "$bad" -gt 0 ]; then echo "gpu_check: $bad problem(s), see the rows above"; exit 1; fi
echo "gpu_check: every row passed${VARIANTS:+ (the variant rows of ${VARIANTS//,/ } only)}"
