#!/usr/bin/env bash
# session 16, call A: branch kda-fin (the channel-decay finish inside the scores kernels, lab v10) vs main fa52f9a
# (.build/old): lab validation (every version), CPU rows kda/pkda, determinism, A/B kda/pkda-340m, lab timing v7 / v10
set -uo pipefail
O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/gpu.txt
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
(make -s train_pdncu > /tmp/b_new.txt 2>&1; echo "new build rc $?") &
(make -s train_pdncu_fp32 train_pdn test_pdn dev/data/train_bpe dev/data/prepare_shards > /tmp/b_cpu.txt 2>&1; echo "fp32+cpu build rc $?") &
(make -s -C dev/cuda delta_chunk > /tmp/b_lab.txt 2>&1; echo "lab build rc $?") &
(cd .build/old && make -s train_pdncu > /tmp/b_old.txt 2>&1; echo "old build rc $?") &
wait
cat /tmp/b_new.txt /tmp/b_cpu.txt /tmp/b_lab.txt /tmp/b_old.txt > $O/build.txt
el builds
./train_pdncu --preset kda-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512 -x 1 2>&1 | grep "mixer kernels" | tee $O/plan.txt
(cd dev/cuda && ./delta_chunk --no-bench > $O/lab_validate.txt 2>&1); echo "delta_chunk validate rc $?"
tail -1 $O/lab_validate.txt; grep -E '^FAIL' $O/lab_validate.txt | head -20
echo "v10: $(grep -E '^PASS' $O/lab_validate.txt | grep -c '^PASS v10') PASS, $(grep -E '^FAIL' $O/lab_validate.txt | grep -c 'v10') FAIL"
el lab validate
c2=$(mktemp -d)
scripts/doc_shard.sh $c2/g340.train_000.bin grid 2 256 64 512 >/dev/null; scripts/doc_shard.sh $c2/g1b.train_000.bin grid 2 200 64 512 >/dev/null
while read -r name args; do
    for bin in train_pdn train_pdncu_fp32 train_pdncu; do ./$bin $args --debug-state $c2/$name.$bin.bin > $c2/$name.$bin.log 2>&1 || echo "FAILED $bin $name"; done
    r32=$(./test_pdn --compare $c2/$name.train_pdn.bin $c2/$name.train_pdncu_fp32.bin | tail -1 | cut -d: -f1)
    r16=$(./test_pdn --compare $c2/$name.train_pdn.bin $c2/$name.train_pdncu.bin | tail -1 | cut -d: -f1)
    w16=$(./test_pdn --compare $c2/$name.train_pdn.bin $c2/$name.train_pdncu.bin | awk '$5 ~ /ok|FAIL/ && $4+0 > m { m = $4 + 0 } END { printf "%.1e", m }')
    printf "%-22s | fp32 %-4s | bf16 %-4s (worst L2 %s)\n" "$name" "$r32" "$r16" "$w16" | tee -a $O/cpu_rows.txt
done <<ROWS
kda-340m --preset kda-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512
pkda-340m --preset pkda-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512
pkda-340m-c32 --preset pkda-340m --n-layer 2 --vocab 512 -b 2 -t 200 -d 400 --chunk 32
kda-340m-docs --preset kda-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512 --doc-mask 1 --eot-id 0 -i $c2/g340.train_*.bin
pkda-1b-docs --preset pkda-1b --n-layer 1 --vocab 512 -b 2 -t 200 -d 400 --doc-mask 1 --eot-id 0 -i $c2/g1b.train_*.bin
kda-1b --preset kda-1b --n-layer 1 --vocab 512 -b 1 -t 200 -d 200
kda-tiny --preset kda-tiny -b 4 -t 100 --mqar-pairs 8
ROWS
el cpu rows
c=$(mktemp -d)
for v in kda pkda; do
    a="--preset $v-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512"
    ./train_pdncu $a --debug-state $c/det1.bin > /dev/null 2>&1; ./train_pdncu $a --debug-state $c/det2.bin > /dev/null 2>&1
    ./train_pdncu $a --recompute 1 --debug-state $c/rec.bin > /dev/null 2>&1
    r1=$(cmp -s $c/det1.bin $c/det2.bin && echo bit-exact || echo DIFFERENT); r2=$(cmp -s $c/det1.bin $c/rec.bin && echo bit-exact || echo DIFFERENT)
    echo "$v: same run twice $r1; --recompute 1 vs 0 $r2" | tee -a $O/det.txt
done
d=$(mktemp -d); scripts/random_shard.sh $d/rand_train_000.bin >/dev/null
run() { local label=$1 bin=$2; shift 2
    local log; log=$($bin "$@" -i "$d/rand_train_*.bin" -x 6 -v 0 -m 1 2>&1)
    local tps=$(echo "$log" | sed -n 's/.*; \([0-9]*\) tok\/s averaged.*/\1/p')
    local mem=$(echo "$log" | sed -n 's/.*device memory in use \([0-9.]*\) GiB.*/\1/p')
    [ -n "$tps" ] || echo "$log" | tail -5
    printf "%-40s %9s tok/s %6s GiB\n" "$label" "$tps" "$mem" | tee -a $O/speed.txt; }
N=./train_pdncu; F=.build/old/train_pdncu; P="-b 16 -t 2048 -d 32768"
run "kda-340m 16x2048 old" $F --preset kda-340m $P
run "kda-340m 16x2048 new" $N --preset kda-340m $P
run "kda-340m 16x2048 old" $F --preset kda-340m $P
run "kda-340m 16x2048 new" $N --preset kda-340m $P
run "pkda-340m 16x2048 new" $N --preset pkda-340m $P
run "pkda-340m 16x2048 old" $F --preset pkda-340m $P
el speed
PDN_PROFILE=1 $N --preset kda-340m $P -i "$d/rand_train_*.bin" -x 4 -v 0 -m 1 2>&1 | sed -n '/where the time goes/,/total/p' > $O/profile_kda_new.txt
grep -E "mixer.bwd|total" $O/profile_kda_new.txt
(cd dev/cuda && ./delta_chunk 7 --no-validate > /tmp/t7.txt 2>&1; ./delta_chunk 10 --no-validate > /tmp/t10.txt 2>&1)
cat /tmp/t7.txt /tmp/t10.txt > $O/lab_time.txt
echo "lab kda/pkda v7 | v10:"; paste <(grep -E '^v7 .* p?kda ' /tmp/t7.txt | cut -c1-64) <(grep -E '^v10 .* p?kda ' /tmp/t10.txt | cut -c32-64)
el all
