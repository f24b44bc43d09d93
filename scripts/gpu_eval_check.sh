#!/usr/bin/env bash
# The --eval modes on a GPU against the CPU reference (run on a machine with an NVIDIA GPU; trains nothing big): a
# small PGDN checkpoint trained here on the CPU (40 steps of pgdn-small on tinyshakespeare with a 512-token BPE, ~1
# minute on 16 cores), then every mode with train_pdn, train_pdncu_fp32 and train_pdncu on the same checkpoint:
#   ppl     loss and bits per byte per window length: fp32 within 1e-4 relative of the CPU, bf16 within 2e-2
#           (bf16 logits keep 8 bits: ~0.4% per logit, averaging down over thousands of tokens)
#   mc      every completion's log-likelihood: fp32 within 1e-3 + 1e-4 |ll|; bf16 within 0.05 + 0.02 |ll|; acc and
#           acc_norm printed (bf16 may differ from the CPU only where those bounds allow a different pick)
#   sniah1, sniah3  the fp32 build's generated tokens equal to the CPU's, sample by sample (greedy, up to 128);
#           bf16: the fraction of samples with the same tokens is printed, not checked (a near tie flips a token)
#   state   the carried state against one full forward ("max |dlogp|" of each length): fp32 <= 1e-3, bf16 <= 0.25
# Prints a table last; exit 1 on any mismatch. Needs ../shared/data/tinyshakespeare.txt (or TEXT=FILE).
# Usage: scripts/gpu_eval_check.sh [OUTDIR]   (default /tmp/pdn_gpu_eval_check)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/pdn_gpu_eval_check}
text=${TEXT:-../shared/data/tinyshakespeare.txt}
[ -f "$text" ] || { echo "gpu_eval_check: no text at $text (set TEXT=FILE)" >&2; exit 1; }
mkdir -p "$out"
make -s train_pdn train_pdncu train_pdncu_fp32 dev/data/train_bpe dev/data/prepare_shards dev/data/make_mc || exit 1
./dev/data/train_bpe --vocab-size 512 --out-dir "$out/tok" --quiet 1 "$text" > /dev/null || exit 1
tok=$out/tok/tokenizer.bin
./dev/data/prepare_shards --tokenizer "$tok" --out "$out/data/ts" --val-tokens 32768 --separator '\n\n' --keep-separator 1 \
    --quiet 1 "$text" > /dev/null || exit 1
rm -rf "$out/run"
./train_pdn --preset pgdn-small --mixer token -i "$out/data/ts_train_*.bin" --tokenizer "$tok" -b 16 -t 128 -x 40 -l 3e-3 \
    -u 10 -v 0 -o "$out/run" > "$out/train.txt" || { echo "gpu_eval_check: CPU training failed ($out/train.txt)" >&2; exit 1; }
ck=$out/run/model_00000040.bin
./dev/data/make_mc --tokenizer "$tok" --out "$out/mc.bin" dev/data/fixtures/mc_items.txt > /dev/null || exit 1
declare -A args=(
    [ppl]="--eval ppl -j '$out/data/ts_val_*.bin' --eval-len 128,1024,4096"
    [mc]="--eval mc --eval-file $out/mc.bin"
    [sniah1]="--eval sniah1 --eval-len 512,2048,8192 --eval-samples 2"
    [sniah3]="--eval sniah3 --haystack $text --eval-len 1024,4096 --eval-samples 2"
)
bins=(train_pdn train_pdncu_fp32 train_pdncu)
for mode in ppl mc sniah1 sniah3; do
    for bin in "${bins[@]}"; do
        d=$out/$mode.$bin
        rm -rf "$d"
        eval ./$bin -e "$ck" --tokenizer "$tok" ${args[$mode]} -o "$d" > "$d.txt" 2>&1 || echo "FAILED: $bin --eval $mode ($d.txt)"
    done
done
rows=(); bad=0
row() { rows+=("$(printf '%-7s %-17s | %-4s | %s' "$1" "$2" "$3" "$4")"); [ "$3" = ok ] || [ "$3" = info ] || bad=1; }
for bin in train_pdncu_fp32 train_pdncu; do
    fp32=0; [ $bin = train_pdncu_fp32 ] && fp32=1
    c=$out/ppl.train_pdn/eval_ppl.tsv; g=$out/ppl.$bin/eval_ppl.tsv
    if [ -f "$c" ] && [ -f "$g" ]; then
        r=$(paste "$c" "$g" | awk -F'\t' -v f=$fp32 'NR > 1 { tol = f ? 1e-4 : 2e-2; d1 = ($6 - $15) / $6; d2 = ($8 - $17) / $8;
               d1 = d1 < 0 ? -d1 : d1; d2 = d2 < 0 ? -d2 : d2; m = d1 > m ? d1 : m; m = d2 > m ? d2 : m; n++ }
               END { printf "%s %d windows lengths, worst rel diff of loss/bpb %.1e (tol %g)", (n == 3 && m <= (f ? 1e-4 : 2e-2)) ? "ok" : "FAIL", n, m, f ? 1e-4 : 2e-2 }')
        row ppl $bin "${r%% *}" "${r#* }"
    else row ppl $bin FAIL "missing table ($out/ppl.$bin.txt)"; fi
    c=$out/mc.train_pdn/eval_mc_samples.tsv; g=$out/mc.$bin/eval_mc_samples.tsv
    if [ -f "$c" ] && [ -f "$g" ]; then
        r=$(paste "$c" "$g" | awk -F'\t' -v f=$fp32 'NR > 1 { na = split($5, a, " "); split($11, b, " ");
               for (i = 1; i <= na; i++) { d = a[i] - b[i]; d = d < 0 ? -d : d; x = a[i] < 0 ? -a[i] : a[i];
                   tol = f ? 1e-3 + 1e-4 * x : 0.05 + 0.02 * x; if (d > tol) bad++; m = d > m ? d : m; n++ }
               same += $3 == $9 }
               END { printf "%s %d completions, worst |dll| %.2e, %d out of bounds; acc picks equal on %d of %d", bad ? "FAIL" : "ok", n, m, bad, same, NR - 1 }')
        accs=$(awk -F'\t' 'NR == 2 { printf "acc %.3f acc_norm %.3f", $2, $3 }' "$out/mc.$bin/eval_mc.tsv")
        row mc $bin "${r%% *}" "${r#* }; $accs"
    else row mc $bin FAIL "missing table ($out/mc.$bin.txt)"; fi
    for t in sniah1 sniah3; do
        c=$out/$t.train_pdn/eval_${t}_samples.tsv; g=$out/$t.$bin/eval_${t}_samples.tsv
        if [ -f "$c" ] && [ -f "$g" ]; then
            r=$(paste "$c" "$g" | awk -F'\t' -v f=$fp32 'NR > 1 { n++; same += $8 == $17; right_c += $7; right_g += $16 }
                   END { printf "%s %d of %d samples generate the same tokens; correct: cpu %d, gpu %d", (f && same != n) ? "FAIL" : (f ? "ok" : "info"), same, n, right_c, right_g }')
            row $t $bin "${r%% *}" "${r#* }"
        else row $t $bin FAIL "missing table ($out/$t.$bin.txt)"; fi
        s=$(grep -o 'max |dlogp| [0-9.e+-]*' "$out/$t.$bin.txt" | awk -v f=$fp32 '{ v = $3 + 0; m = v > m ? v : m; n++ }
               END { printf "%s %d lengths, worst %.2e (tol %g)", (n > 0 && m <= (f ? 1e-3 : 0.25)) ? "ok" : "FAIL", n, m, f ? 1e-3 : 0.25 }')
        row state "$bin $t" "${s%% *}" "${s#* }"
    done
done
echo
echo "gpu_eval_check: --eval on $ck (pgdn-small, 40 CPU steps), CUDA builds against train_pdn"
printf '%s\n' "${rows[@]}"
[ $bad = 0 ] && echo "PASS" || echo "FAIL (outputs in $out)"
exit $bad
