#!/usr/bin/env bash
# the backward's diagonal change alone (forward reverted): A/B kda/pkda-340m against main 1f7d542, lab v7 timing
set -uo pipefail
O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/gpu.txt
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
(make -s train_pdncu > /tmp/b_new.txt 2>&1; echo "new build rc $?") &
(make -s -C dev/cuda delta_chunk > /tmp/b_lab.txt 2>&1; echo "lab build rc $?") &
(cd .build/old && make -s train_pdncu > /tmp/b_old.txt 2>&1; echo "old build rc $?") &
wait
el builds
d=$(mktemp -d); scripts/random_shard.sh $d/rand_train_000.bin >/dev/null
run() { local label=$1 bin=$2; shift 2
    local log; log=$($bin "$@" -i "$d/rand_train_*.bin" -x 6 -v 0 -m 1 2>&1)
    local tps=$(echo "$log" | sed -n 's/.*; \([0-9]*\) tok\/s averaged.*/\1/p')
    local mem=$(echo "$log" | sed -n 's/.*device memory in use \([0-9.]*\) GiB.*/\1/p')
    [ -n "$tps" ] || echo "$log" | tail -5
    printf "%-40s %9s tok/s %6s GiB\n" "$label" "$tps" "$mem" | tee -a $O/speed.txt; }
N=./train_pdncu; F=.build/old/train_pdncu; P="-b 16 -t 2048 -d 32768"
run "kda-340m 16x2048 bwd-only" $N --preset kda-340m $P
run "kda-340m 16x2048 old" $F --preset kda-340m $P
run "kda-340m 16x2048 bwd-only" $N --preset kda-340m $P
run "kda-340m 16x2048 old" $F --preset kda-340m $P
run "pkda-340m 16x2048 bwd-only" $N --preset pkda-340m $P
run "pkda-340m 16x2048 old" $F --preset pkda-340m $P
el speed
(cd dev/cuda && ./delta_chunk 7 --no-validate > $O/lab_time.txt 2>&1); grep -E '^v7 .* p?kda ' $O/lab_time.txt | cut -c1-62
el all
