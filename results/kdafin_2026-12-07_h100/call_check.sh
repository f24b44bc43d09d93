#!/usr/bin/env bash
# session 16 call 1: full gpu_check on main fa52f9a (first since 1003cf8 / 41bce68), lab validation, QUICK bench
set -uo pipefail
O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
(make -s train_pdn test_pdn train_pdncu > /tmp/b1.txt 2>&1; echo "build1 rc $?") &
(make -s train_pdncu_fp32 dev/data/train_bpe dev/data/prepare_shards > /tmp/b2.txt 2>&1; echo "build2 rc $?") &
(make -s -C dev/cuda delta_chunk > /tmp/b3.txt 2>&1; echo "lab build rc $?") &
wait; cat /tmp/b1.txt /tmp/b2.txt /tmp/b3.txt > $O/build.txt; el builds
scripts/gpu_check.sh /tmp/gc > $O/gpu_check.txt 2>&1; echo "gpu_check rc $?"; el gpu_check
tail -60 $O/gpu_check.txt | grep -vE ' ok$' | tail -45
(cd dev/cuda && ./delta_chunk --no-bench > $O/lab_validate.txt 2>&1); echo "lab validate rc $?"; tail -1 $O/lab_validate.txt; grep -E '^FAIL' $O/lab_validate.txt | head
el lab
QUICK=1 SKIP_LAB=1 scripts/bench_gpu.sh > $O/bench_quick.txt 2>&1; echo "bench rc $?"; tail -9 $O/bench_quick.txt
el all
