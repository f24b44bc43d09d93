#!/usr/bin/env bash
# main 5775616 (fused chunk backward on): gpu_check.sh in full, the delta_chunk lab's whole validation (v8 ~ v2), precond_scan lab, profiles
set -uo pipefail
O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
(make -s -C dev/cuda delta_chunk precond_scan > $O/build_lab.txt 2>&1; echo "lab build rc $?"
 cd dev/cuda && ./delta_chunk --no-bench > /tmp/lab_validate.txt 2>&1; echo "delta_chunk validate rc $?"; tail -1 /tmp/lab_validate.txt
 grep "v8.*~ v2" /tmp/lab_validate.txt | awk '{print $(NF-2)}' | sort -g | tail -1 | sed 's/^/v8 ~ v2 worst: /'; grep -c "v8.*~ v2" /tmp/lab_validate.txt; grep -E '^FAIL' /tmp/lab_validate.txt | head
 grep -E "^(PASS|FAIL) v8" /tmp/lab_validate.txt > $O/lab_validate_v8_all.txt) &
scripts/gpu_check.sh /tmp/gc > $O/gpu_check.txt 2>&1; echo "gpu_check rc $?"
wait
el gpu_check + lab validate
sed -n '/== the rows of gpu_check ==/,$p' $O/gpu_check.txt | tail -80
(cd dev/cuda && ./precond_scan > $O/precond_scan.txt 2>&1; echo "precond_scan rc $?"; grep -E "^RESULT|^FAIL" $O/precond_scan.txt | head; grep -E "^v(6|10) " $O/precond_scan.txt | head -12)
el precond lab
d=$(mktemp -d); scripts/random_shard.sh $d/rand_train_000.bin >/dev/null
for v in pgdn kda; do
  echo "== profile $v-340m 16x2048 =="
  PDN_PROFILE=1 ./train_pdncu --preset $v-340m -b 16 -t 2048 -d 32768 -i "$d/rand_train_*.bin" -x 4 -v 0 -m 1 2>&1 | sed -n '/where the time goes/,/total/p'
done | tee $O/profiles.txt
el all
