#!/usr/bin/env bash
# The cost of packed documents on the GPU (issue 18): train_pdncu at the training shape on shards of packed documents
# (scripts/doc_shard.sh lengths: uniform random tokens, documents of 1 .. 1,999 tokens, ~1,000 on average; and of
# ~100), each row run with --doc-mask 0 and --doc-mask 1 on the same shard in one job (the first pgdn row again in
# the other order, for the spread). Tokens/s from the trainer's average over the timed steps (the first untimed),
# device memory from cudaMemGetInfo at the end; ratio = doc-mask 1 / doc-mask 0.
# Usage: scripts/bench_docs.sh [steps]     (BENCH_QUICK=1: the pgdn, pkda and short-document rows only)
set -uo pipefail
cd "$(dirname "$0")/.."
steps=${1:-6}
make -s train_pdncu || exit 1
data=$(mktemp -d /tmp/pdn_bench_docs_XXXXXX)
trap 'rm -rf "$data"' EXIT
scripts/doc_shard.sh "$data/d1000_train_000.bin" lengths 2097152 32000 1000 || exit 1
scripts/doc_shard.sh "$data/d100_train_000.bin" lengths 2097152 32000 100 || exit 1
# run LABEL MASK ARGS...: tok/s and GiB of one run
run() {
    local log
    log=$(./train_pdncu "${@:2}" --doc-mask "$1" --eot-id 0 -x "$steps" -v 0 -m 1 2>&1)
    local tps mem
    tps=$(echo "$log" | sed -n 's/.*; \([0-9]*\) tok\/s averaged.*/\1/p')
    mem=$(echo "$log" | sed -n 's/.*device memory in use \([0-9.]*\) GiB.*/\1/p')
    [ -n "$tps" ] || { echo "$log" | tail -5 >&2; tps=0; }
    echo "$tps $mem"
}
rows=()
# row LABEL ORDER ARGS...: ORDER 01 runs --doc-mask 0 first, 10 the other way round
row() {
    local label=$1 order=$2; shift 2
    local a b
    if [ "$order" = 01 ]; then a=$(run 0 "$@"); b=$(run 1 "$@"); else b=$(run 1 "$@"); a=$(run 0 "$@"); fi
    rows+=("$(echo "$a $b" | awk -v l="$label" '{ printf "%-34s | %9d tok/s %5.1f GiB | %9d tok/s %5.1f GiB | %.3f", l, $1, $2, $3, $4, ($1 > 0 ? $3 / $1 : 0) }')")
    echo "${rows[-1]}"
}
d1000=(-i "$data/d1000_train_*.bin")
d100=(-i "$data/d100_train_*.bin")
row "pgdn-340m 16x2048, docs ~1000" 01 --preset pgdn-340m "${d1000[@]}" -b 16 -t 2048 -d 32768
row "pgdn-340m 16x2048, docs ~1000" 10 --preset pgdn-340m "${d1000[@]}" -b 16 -t 2048 -d 32768
row "pkda-340m 16x2048, docs ~1000" 01 --preset pkda-340m "${d1000[@]}" -b 16 -t 2048 -d 32768
row "pgdn-340m 16x2048, docs ~100" 01 --preset pgdn-340m "${d100[@]}" -b 16 -t 2048 -d 32768
if [ -z "${BENCH_QUICK:-}" ]; then
    row "gdn-340m 16x2048, docs ~1000" 01 --preset gdn-340m "${d1000[@]}" -b 16 -t 2048 -d 32768
    row "pgdn-340m 1x32768, docs ~1000" 01 --preset pgdn-340m "${d1000[@]}" -b 1 -t 32768 -d 32768
fi
echo "== --doc-mask 0 vs 1, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%Y-%m-%d), $steps steps (the first untimed) =="
printf '%-34s | %-25s | %-25s | %s\n' "run" "--doc-mask 0" "--doc-mask 1" "ratio"
printf '%s\n' "${rows[@]}"
