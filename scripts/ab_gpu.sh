#!/usr/bin/env bash
# A/B speed of two builds of the GPU trainer in one job: this tree's train_pdncu (built here) against OLD_DIR's
# (built there first, e.g. from `git archive main | tar -x -C OLD_DIR`). For each row the two binaries alternate
# REPS times in the order old, new, new, old, old, new ... (so a slow drift of the card's clock favours neither), each
# run 6 optimizer steps of one micro-batch on a shard of uniform random tokens (scripts/random_shard.sh), the first
# step untimed, as scripts/bench_gpu.sh runs them. Prints every run as it comes, then a table: the mean tok/s of
# each build, new / old, and the device memory each held.
# Usage: scripts/ab_gpu.sh OLD_DIR [ROW ...]     ROW = PRESET[:BxT] (default 16x2048), e.g. kda-340m pgdn-340m:1x32768
#        REPS=2 (default), STEPS=6, EXTRA='--recompute 1' (added to every run of both builds)
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 OLD_DIR [PRESET[:BxT] ...]" >&2; exit 2; }
old=$1; shift
[ -x "$old/train_pdncu" ] || { echo "$0: $old/train_pdncu not found: build it there first (make -C $old train_pdncu)" >&2; exit 2; }
rows=("$@"); [ ${#rows[@]} -gt 0 ] || rows=(pgdn-340m kda-340m)
reps=${REPS:-2} steps=${STEPS:-6}
make -s train_pdncu || exit 1
data=$(mktemp -d /tmp/pdn_ab_XXXXXX)
trap 'rm -rf "$data"' EXIT
scripts/random_shard.sh "$data/rand_train_000.bin" || exit 1
# one run: prints "TOKS MEM" (FAILED where the log has no average)
one() {
    local bin=$1 preset=$2 B=$3 T=$4 log tps mem
    # shellcheck disable=SC2086 # EXTRA is a list of flags
    log=$("$bin" --preset "$preset" -i "$data/rand_train_*.bin" -b "$B" -t "$T" -d $((B * T)) -x "$steps" -v 0 -m 1 ${EXTRA:-} 2>&1)
    tps=$(echo "$log" | sed -n 's/.*; \([0-9]*\) tok\/s averaged.*/\1/p')
    mem=$(echo "$log" | sed -n 's/.*device memory in use \([0-9.]*\) GiB.*/\1/p')
    [ -n "$tps" ] || { echo "$log" | tail -5 >&2; tps=FAILED; }
    echo "$tps ${mem:--}"
}
table=() failed=0
for row in "${rows[@]}"; do
    preset=${row%%:*} shape=16x2048
    [ "$row" != "$preset" ] && shape=${row#*:}
    B=${shape%x*} T=${shape#*x}
    [[ "$B" =~ ^[0-9]+$ && "$T" =~ ^[0-9]+$ ]] || { echo "$0: row '$row': want PRESET[:BxT]" >&2; exit 2; }
    so=0 sn=0 no=0 nn=0 mo=- mn=- bad=0
    for ((r = 0; r < 2 * reps; r++)); do
        if (( (r + r / 2) % 2 == 0 )); then which=old bin=$old/train_pdncu; else which=new bin=./train_pdncu; fi
        read -r tps mem < <(one "$bin" "$preset" "$B" "$T")
        printf "%-26s %-3s %9s tok/s %6s GiB\n" "$preset ${B}x$T" "$which" "$tps" "$mem"
        [ "$tps" = FAILED ] && { bad=1; continue; }
        if [ $which = old ]; then so=$((so + tps)); no=$((no + 1)); mo=$mem; else sn=$((sn + tps)); nn=$((nn + 1)); mn=$mem; fi
    done
    if [ $bad = 1 ] || [ $no = 0 ] || [ $nn = 0 ]; then
        table+=("$(printf "%-26s | %s" "$preset ${B}x$T" "FAILED (see above)")"); failed=1
    else
        table+=("$(awk -v r="$preset ${B}x$T" -v so=$so -v no=$no -v sn=$sn -v nn=$nn -v mo=$mo -v mn=$mn \
            'BEGIN { printf "%-26s | %9.0f | %9.0f | %6.3f | %s / %s GiB", r, so / no, sn / nn, (sn / nn) / (so / no), mo, mn }')")
    fi
done
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "== A/B, ${gpu:-no GPU name}, $(date -u +%Y-%m-%d), old $old, $reps runs each, tok/s means =="
printf "%-26s | %9s | %9s | %6s | %s\n" "row" "old" "new" "new/old" "memory old / new"
printf '%s\n' "${table[@]}"
exit $failed
