#!/usr/bin/env bash
# prep_wy (delta_chunk v9): the lab's whole validation, A/B main (PREP_WY_DEFAULT 0) vs pw (1), CPU rows and
# determinism with pw, lab timing v8 / v9; then scripts/bench_gpu.sh (SKIP_LAB=1) on pw if everything passed, else main
set -uo pipefail
O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
PWCMD=$(make -B -n train_pdncu | tail -1 | sed 's/ train_pdn.cu / -DPREP_WY_DEFAULT=1 train_pdn.cu /; s/-o train_pdncu$/-o train_pdncu_pw/')
(make -s train_pdncu train_pdncu_fp32 train_pdn test_pdn > /tmp/build_main.txt 2>&1; echo "main build rc $?") &
($PWCMD > /tmp/build_pw.txt 2>&1; echo "pw build rc $?") &
(make -s -C dev/cuda delta_chunk > /tmp/build_lab.txt 2>&1; echo "lab build rc $?") &
wait
cat /tmp/build_main.txt /tmp/build_pw.txt /tmp/build_lab.txt > $O/build.txt
el builds
ok=1
(cd dev/cuda && ./delta_chunk --no-bench > /tmp/lab_validate.txt 2>&1); lrc=$?; echo "delta_chunk validate rc $lrc"; [ $lrc = 0 ] || ok=0
tail -1 /tmp/lab_validate.txt; grep -E "^(PASS|FAIL|skip) v9" /tmp/lab_validate.txt > $O/lab_v9.txt; grep -E '^FAIL' /tmp/lab_validate.txt | head
echo "v9 checks: $(grep -c '^PASS v9' $O/lab_v9.txt) PASS, $(grep -c '^FAIL v9' $O/lab_v9.txt) FAIL; v9 ~ v2 worst: $(grep 'v9.*~ v2' $O/lab_v9.txt | awk '{print $(NF-2)}' | sort -g | tail -1) ($(grep -c 'v9.*~ v2' $O/lab_v9.txt) shapes)"
el lab validate
d=$(mktemp -d); scripts/random_shard.sh $d/rand_train_000.bin >/dev/null
run() { local label=$1 bin=$2; shift 2
    local log; log=$($bin "$@" -i "$d/rand_train_*.bin" -x 6 -v 0 -m 1 2>&1)
    local tps=$(echo "$log" | sed -n 's/.*; \([0-9]*\) tok\/s averaged.*/\1/p')
    local mem=$(echo "$log" | sed -n 's/.*device memory in use \([0-9.]*\) GiB.*/\1/p')
    [ -n "$tps" ] || echo "$log" | tail -5
    printf "%-40s %9s tok/s %6s GiB\n" "$label" "$tps" "$mem"; }
N=./train_pdncu; F=./train_pdncu_pw; P="--preset pgdn-340m -b 16 -t 2048 -d 32768"
$F $P -i "$d/rand_train_*.bin" -x 1 -v 0 -m 1 2>&1 | grep "mixer kernels" | head -1
run "pgdn-340m 16x2048 main" $N $P
run "pgdn-340m 16x2048 pw" $F $P
run "pgdn-340m 16x2048 main" $N $P
run "pgdn-340m 16x2048 pw" $F $P
run "kda-340m 16x2048 pw" $F --preset kda-340m -b 16 -t 2048 -d 32768
run "kda-340m 16x2048 main" $N --preset kda-340m -b 16 -t 2048 -d 32768
el speed
c=$(mktemp -d)
scripts/doc_shard.sh $c/g340.train_000.bin grid 2 256 64 512 >/dev/null; scripts/doc_shard.sh $c/g1b.train_000.bin grid 2 200 64 512 >/dev/null
while read -r name args; do
    for bin in train_pdn train_pdncu_fp32 train_pdncu_pw; do ./$bin $args --debug-state $c/$name.$bin.bin > $c/$name.$bin.log 2>&1 || echo "FAILED $bin $name"; done
    r32=$(./test_pdn --compare $c/$name.train_pdn.bin $c/$name.train_pdncu_fp32.bin | tail -1 | cut -d: -f1)
    r16=$(./test_pdn --compare $c/$name.train_pdn.bin $c/$name.train_pdncu_pw.bin | tail -1 | cut -d: -f1)
    w32=$(./test_pdn --compare $c/$name.train_pdn.bin $c/$name.train_pdncu_fp32.bin | awk '$5 ~ /ok|FAIL/ && $3+0 > m { m = $3 + 0 } END { printf "%.1e", m }')
    w16=$(./test_pdn --compare $c/$name.train_pdn.bin $c/$name.train_pdncu_pw.bin | awk '$5 ~ /ok|FAIL/ && $4+0 > m { m = $4 + 0 } END { printf "%.1e", m }')
    [ "$r32" = PASS ] && [ "$r16" = PASS ] || ok=0
    printf "%-22s | fp32 %-4s (worst max-rel %s) | bf16 pw %-4s (worst L2 %s)\n" "$name" "$r32" "$w32" "$r16" "$w16" | tee -a $O/cpu_rows.txt
done <<ROWS
pgdn-340m --preset pgdn-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512
pkda-340m --preset pkda-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512
pgdn-340m-c32 --preset pgdn-340m --n-layer 2 --vocab 512 -b 2 -t 200 -d 400 --chunk 32
pgdn-340m-docs --preset pgdn-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512 --doc-mask 1 --eot-id 0 -i $c/g340.train_*.bin
pkda-1b-docs --preset pkda-1b --n-layer 1 --vocab 512 -b 2 -t 200 -d 400 --doc-mask 1 --eot-id 0 -i $c/g1b.train_*.bin
ROWS
el cpu rows
for v in pgdn kda; do
    a="--preset $v-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512"
    $F $a --debug-state $c/det1.bin > /dev/null 2>&1; $F $a --debug-state $c/det2.bin > /dev/null 2>&1
    $F $a --recompute 1 --debug-state $c/rec.bin > /dev/null 2>&1
    r1=$(cmp -s $c/det1.bin $c/det2.bin && echo bit-exact || echo DIFFERENT); r2=$(cmp -s $c/det1.bin $c/rec.bin && echo bit-exact || echo DIFFERENT)
    [ "$r1$r2" = bit-exactbit-exact ] || ok=0
    echo "$v pw: same run twice $r1; --recompute 1 vs 0 $r2" | tee -a $O/cpu_rows.txt
done
el determinism
(cd dev/cuda && ./delta_chunk 8 --no-validate > /tmp/t8.txt 2>&1; ./delta_chunk 9 --no-validate > /tmp/t9.txt 2>&1; cat /tmp/t8.txt /tmp/t9.txt > $O/lab_time.txt; paste <(grep -E '^v8 ' /tmp/t8.txt | cut -c1-62) <(grep -E '^v9 ' /tmp/t9.txt | cut -c32-62))
el lab time
if [ $ok = 1 ]; then echo "everything passed: the bench runs pw (PREP_WY_DEFAULT 1)"; cp train_pdncu_pw train_pdncu; else echo "SOMETHING FAILED: the bench runs main"; fi
B=./train_pdncu
run "pgdn-340m 1x32768 final" $B --preset pgdn-340m -b 1 -t 32768 -d 32768
run "pgdn-340m 4x8192 final" $B --preset pgdn-340m -b 4 -t 8192 -d 32768
el long rows
left=$(( 385 - ($(date +%s) - t0) ))
QUICK=1 SKIP_LAB=1 timeout $left scripts/bench_gpu.sh 6 > $O/bench.txt 2>&1; echo "bench rc $?"
tail -9 $O/bench.txt
el all
