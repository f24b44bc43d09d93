#!/usr/bin/env bash
# v10 (precond carries) + conv streams (v7/v8): labs, bitcmp, CPU comparison, speed A/B/C
set -uo pipefail
O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
(make -s train_pdncu train_pdncu_fp32 train_pdn test_pdn > $O/build_new.txt 2>&1; echo "new build rc $?") &
(cd .build/old && make -s train_pdncu > $O/build_old.txt 2>&1; echo "old build rc $?") &
(cd .build/v10 && make -s train_pdncu > $O/build_v10.txt 2>&1; echo "v10 build rc $?") &
(make -s -C dev/cuda conv_norm > $O/build_lab.txt 2>&1; echo "lab build rc $?") &
wait
el builds
(cd dev/cuda && ./conv_norm > $O/conv_norm.txt 2>&1; echo "conv_norm rc $?"; grep -c '^PASS' $O/conv_norm.txt; grep '^FAIL' $O/conv_norm.txt | head -12; grep -A10 "=== timing" $O/conv_norm.txt)
el conv lab
(cd .build/v10 && scripts/bitcmp.sh ../old train_pdncu > $O/bitcmp_v10_bf16.txt 2>&1; echo "bitcmp v10 vs old bf16 rc $?"; grep -E 'IDENTICAL|DIFFERENT' $O/bitcmp_v10_bf16.txt | cut -c1-110)
el bitcmp
d=$(mktemp -d); scripts/random_shard.sh $d/rand_train_000.bin >/dev/null
run() { local label=$1 bin=$2; shift 2
    local log; log=$($bin "$@" -i "$d/rand_train_*.bin" -x 8 -v 0 -m 1 2>&1)
    local tps=$(echo "$log" | sed -n 's/.*; \([0-9]*\) tok\/s averaged.*/\1/p')
    local mem=$(echo "$log" | sed -n 's/.*device memory in use \([0-9.]*\) GiB.*/\1/p')
    [ -n "$tps" ] || echo "$log" | tail -5
    printf "%-40s %9s tok/s %6s GiB\n" "$label" "$tps" "$mem" | tee -a $O/speed.txt; }
N=./train_pdncu; OLDB=.build/old/train_pdncu; P="--preset pgdn-340m -b 16 -t 2048 -d 32768"
run "pgdn-340m 16x2048 main" $OLDB $P
PDN_CONV_TOK=0 run "pgdn-340m 16x2048 v10" $N $P
PDN_CONV_TOK=32 run "pgdn-340m 16x2048 v10+conv32" $N $P
run "pgdn-340m 16x2048 main" $OLDB $P
PDN_CONV_TOK=0 run "pgdn-340m 16x2048 v10" $N $P
PDN_CONV_TOK=32 run "pgdn-340m 16x2048 v10+conv32" $N $P
el speed
# the trainer with the streams against the CPU reference (gpu_check's shapes, tolerances and verdicts)
c=$(mktemp -d)
scripts/doc_shard.sh $c/g340.train_000.bin grid 2 256 64 512 >/dev/null; scripts/doc_shard.sh $c/g1b.train_000.bin grid 2 200 64 512 >/dev/null
while read -r name args; do
    for bin in train_pdn train_pdncu_fp32 train_pdncu; do ./$bin $args --debug-state $c/$name.$bin.bin > $c/$name.$bin.log 2>&1 || echo "FAILED $bin $name"; done
    r32=$(./test_pdn --compare $c/$name.train_pdn.bin $c/$name.train_pdncu_fp32.bin | tail -1 | cut -d: -f1)
    r16=$(./test_pdn --compare $c/$name.train_pdn.bin $c/$name.train_pdncu.bin | tail -1 | cut -d: -f1)
    w32=$(./test_pdn --compare $c/$name.train_pdn.bin $c/$name.train_pdncu_fp32.bin | awk '$5 ~ /ok|FAIL/ && $3+0 > m { m = $3 + 0 } END { printf "%.1e", m }')
    w16=$(./test_pdn --compare $c/$name.train_pdn.bin $c/$name.train_pdncu.bin | awk '$5 ~ /ok|FAIL/ && $4+0 > m { m = $4 + 0 } END { printf "%.1e", m }')
    printf "%-22s | fp32 %-4s (worst max-rel %s) | bf16 %-4s (worst L2 %s)\n" "$name" "$r32" "$w32" "$r16" "$w16" | tee -a $O/cpu_rows.txt
done <<ROWS
pgdn-tiny --preset pgdn-tiny -b 4 -t 100 --mqar-pairs 8
dn-340m --preset dn-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512
pgdn-340m --preset pgdn-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512
pkda-340m --preset pkda-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512
gdn-1b --preset gdn-1b --n-layer 1 --vocab 512 -b 1 -t 200 -d 200
pkda-1b --preset pkda-1b --n-layer 1 --vocab 512 -b 1 -t 200 -d 200
pgdn-340m-docs --preset pgdn-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512 --doc-mask 1 --eot-id 0 -i $c/g340.train_*.bin
pkda-1b-docs --preset pkda-1b --n-layer 1 --vocab 512 -b 2 -t 200 -d 400 --doc-mask 1 --eot-id 0 -i $c/g1b.train_*.bin
ROWS
el cpu rows
el all
