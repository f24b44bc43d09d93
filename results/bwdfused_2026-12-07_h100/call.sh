#!/usr/bin/env bash
# fused chunk backward (delta_chunk v8): lab validation of v8, speed A/B main (BWD_FUSED_DEFAULT 0) vs fb (1), CPU rows with fb, lab timing v7/v8, profile
set -uo pipefail
O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
FBCMD=$(make -B -n train_pdncu | tail -1 | sed 's/ train_pdn.cu / -DBWD_FUSED_DEFAULT=1 train_pdn.cu /; s/-o train_pdncu$/-o train_pdncu_fb/')
(make -s train_pdncu train_pdncu_fp32 train_pdn test_pdn > $O/build_new.txt 2>&1; echo "main build rc $?") &
($FBCMD > $O/build_fb.txt 2>&1; echo "fb build rc $?") &
(make -s -C dev/cuda delta_chunk > $O/build_lab.txt 2>&1; echo "lab build rc $?") &
wait
el builds
(cd dev/cuda && ./delta_chunk 8 --no-bench > $O/lab_validate_v8.txt 2>&1; echo "lab v8 validate rc $?"; grep -c '^PASS' $O/lab_validate_v8.txt; grep -E '^FAIL' $O/lab_validate_v8.txt | head -12; grep "~ v2" $O/lab_validate_v8.txt | awk '{print $NF, $0}' | sort -g | tail -4)
el lab validate
d=$(mktemp -d); scripts/random_shard.sh $d/rand_train_000.bin >/dev/null
run() { local label=$1 bin=$2; shift 2
    local log; log=$($bin "$@" -i "$d/rand_train_*.bin" -x 6 -v 0 -m 1 2>&1)
    local tps=$(echo "$log" | sed -n 's/.*; \([0-9]*\) tok\/s averaged.*/\1/p')
    local mem=$(echo "$log" | sed -n 's/.*device memory in use \([0-9.]*\) GiB.*/\1/p')
    [ -n "$tps" ] || echo "$log" | tail -5
    printf "%-40s %9s tok/s %6s GiB\n" "$label" "$tps" "$mem" | tee -a $O/speed.txt; }
N=./train_pdncu; F=./train_pdncu_fb; P="--preset pgdn-340m -b 16 -t 2048 -d 32768"
$F $P -i "$d/rand_train_*.bin" -x 1 -v 0 -m 1 2>&1 | grep -A3 "mixer kernels" | head -4
run "pgdn-340m 16x2048 main" $N $P
run "pgdn-340m 16x2048 fb" $F $P
run "pgdn-340m 16x2048 main" $N $P
run "pgdn-340m 16x2048 fb" $F $P
el speed
c=$(mktemp -d)
scripts/doc_shard.sh $c/g340.train_000.bin grid 2 256 64 512 >/dev/null; scripts/doc_shard.sh $c/g1b.train_000.bin grid 2 200 64 512 >/dev/null
while read -r name args; do
    for bin in train_pdn train_pdncu_fp32 train_pdncu_fb; do ./$bin $args --debug-state $c/$name.$bin.bin > $c/$name.$bin.log 2>&1 || echo "FAILED $bin $name"; done
    r32=$(./test_pdn --compare $c/$name.train_pdn.bin $c/$name.train_pdncu_fp32.bin | tail -1 | cut -d: -f1)
    r16=$(./test_pdn --compare $c/$name.train_pdn.bin $c/$name.train_pdncu_fb.bin | tail -1 | cut -d: -f1)
    w32=$(./test_pdn --compare $c/$name.train_pdn.bin $c/$name.train_pdncu_fp32.bin | awk '$5 ~ /ok|FAIL/ && $3+0 > m { m = $3 + 0 } END { printf "%.1e", m }')
    w16=$(./test_pdn --compare $c/$name.train_pdn.bin $c/$name.train_pdncu_fb.bin | awk '$5 ~ /ok|FAIL/ && $4+0 > m { m = $4 + 0 } END { printf "%.1e", m }')
    printf "%-22s | fp32 %-4s (worst max-rel %s) | bf16 fb %-4s (worst L2 %s)\n" "$name" "$r32" "$w32" "$r16" "$w16" | tee -a $O/cpu_rows.txt
done <<ROWS
pgdn-tiny --preset pgdn-tiny -b 4 -t 100 --mqar-pairs 8
dn-340m --preset dn-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512
pgdn-340m --preset pgdn-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512
pkda-340m --preset pkda-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512
pgdn-340m-c32 --preset pgdn-340m --n-layer 2 --vocab 512 -b 2 -t 200 -d 400 --chunk 32
gdn-1b --preset gdn-1b --n-layer 1 --vocab 512 -b 1 -t 200 -d 200
pkda-1b --preset pkda-1b --n-layer 1 --vocab 512 -b 1 -t 200 -d 200
pgdn-340m-docs --preset pgdn-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512 --doc-mask 1 --eot-id 0 -i $c/g340.train_*.bin
pkda-1b-docs --preset pkda-1b --n-layer 1 --vocab 512 -b 2 -t 200 -d 400 --doc-mask 1 --eot-id 0 -i $c/g1b.train_*.bin
ROWS
el cpu rows
for v in pgdn dn; do
    a="--preset $v-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512"
    $F $a --debug-state $c/det1.bin > /dev/null 2>&1; $F $a --debug-state $c/det2.bin > /dev/null 2>&1
    $F $a --recompute 1 --debug-state $c/rec.bin > /dev/null 2>&1
    echo "$v fb: same run twice $(cmp -s $c/det1.bin $c/det2.bin && echo bit-exact || echo DIFFERENT); --recompute 1 vs 0 $(cmp -s $c/det1.bin $c/rec.bin && echo bit-exact || echo DIFFERENT)" | tee -a $O/cpu_rows.txt
done
el determinism
(cd dev/cuda && ./delta_chunk 7 --no-validate > $O/lab_time_v7.txt 2>&1; ./delta_chunk 8 --no-validate > $O/lab_time_v8.txt 2>&1; paste <(grep -E '^v7 ' $O/lab_time_v7.txt | cut -c1-62) <(grep -E '^v8 ' $O/lab_time_v8.txt | cut -c32-62))
el lab time
run "gdn-340m 16x2048 main" $N --preset gdn-340m -b 16 -t 2048 -d 32768
run "gdn-340m 16x2048 fb" $F --preset gdn-340m -b 16 -t 2048 -d 32768
run "pgdn-340m 1x32768 main" $N --preset pgdn-340m -b 1 -t 32768 -d 32768
run "pgdn-340m 1x32768 fb" $F --preset pgdn-340m -b 1 -t 32768 -d 32768
el speed2
PDN_PROFILE=1 $N $P -i "$d/rand_train_*.bin" -x 4 -v 0 -m 1 2>&1 | sed -n '/where the time goes/,/total/p' > $O/profile_main.txt
PDN_PROFILE=1 $F $P -i "$d/rand_train_*.bin" -x 4 -v 0 -m 1 2>&1 | sed -n '/where the time goes/,/total/p' > $O/profile_fb.txt
grep "mixer.bwd\|total" $O/profile_main.txt $O/profile_fb.txt
el all
