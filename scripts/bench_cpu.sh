#!/usr/bin/env bash
# CPU throughput of the reference trainer: training tokens/s (forward + backward + AdamW) for every variant,
# at the tiny MQAR shape of the default job and for one 340m-shaped layer (d 1024, 8 heads, K = V = 128,
# MLP 2816; vocabulary 64 so the classifier does not dominate), chunkwise and per-token mixer.
# Usage: scripts/bench_cpu.sh [threads]   (prints a table; tok/s = mean of the timed steps after the first)
set -euo pipefail
cd "$(dirname "$0")/.."
make -s train_pdn >/dev/null
threads=${1:-0}

toks() { # run a short job, average tok/s over steps 2..N
    ./train_pdn --threads "$threads" "$@" -v 0 -m 1 | awk '/^step/ { for (i = 1; i <= NF; i++) if ($i == "tok/s") { n++; if (n > 1) { s += $(i-1); c++ } } } END { printf "%.0f", c ? s / c : 0 }'
}

printf "CPU: %s, %s threads, %s\n" "$(lscpu | sed -n 's/^Model name: *//p' | head -1)" "$( [ "$threads" = 0 ] && nproc || echo "$threads")" "$(date -u +%Y-%m-%d)"
printf "%-6s | %14s | %14s | %18s | %18s\n" variant "tiny chunk" "tiny token" "340m-layer chunk" "340m-layer token"
printf -- "-------+----------------+----------------+--------------------+-------------------\n"
for v in dn pdn gdn pgdn kda pkda; do
    tc=$(toks --preset "$v-tiny" -x 12)
    tt=$(toks --preset "$v-tiny" -x 12 --mixer token)
    lc=$(toks --preset "$v-340m" --n-layer 1 --vocab 64 -b 1 -t 512 -d 512 -x 4)
    lt=$(toks --preset "$v-340m" --n-layer 1 --vocab 64 -b 1 -t 512 -d 512 -x 4 --mixer token)
    printf "%-6s | %10s tok/s | %10s tok/s | %14s tok/s | %14s tok/s\n" "$v" "$tc" "$tt" "$lc" "$lt"
done
