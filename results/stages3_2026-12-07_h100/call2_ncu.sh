#!/usr/bin/env bash
# session 18 call 2: where the scans' time goes at 1 x 32768 (ncu source-level stall sampling, lineinfo build of main), and lab v11 timed
set -uo pipefail
O=${OUT:-/tmp/out}; mkdir -p $O
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
(cd .build/li && make -s train_pdncu NVCCFLAGS="-O3 -std=c++17 -arch=sm_90 -lineinfo -Xcompiler -Wall" > /tmp/bl.txt 2>&1; echo "lineinfo build rc $?") &
p1=$!
(make -s -C dev/cuda delta_chunk > /tmp/bd.txt 2>&1; echo "lab build rc $?") &
p2=$!
wait $p1 $p2; el builds
which ncu; ncu --version | tail -1
d=$(mktemp -d); scripts/random_shard.sh $d/rand_train_000.bin > /dev/null
for k in forward backward; do
  ncu --clock-control none -k regex:state_${k}_wmma --launch-count 1 --set full --import-source yes -o /tmp/$k \
     .build/li/train_pdncu --preset pgdn-340m -i "$d/rand_train_*.bin" -b 1 -t 32768 -d 32768 -x 1 -v 0 -m 1 > $O/ncu_run_$k.txt 2>&1
  echo "ncu $k rc $?"; tail -3 $O/ncu_run_$k.txt
  ncu -i /tmp/$k.ncu-rep --page details > $O/${k}_details.txt 2>&1
  ncu -i /tmp/$k.ncu-rep --page raw --csv > /tmp/${k}_raw.csv 2>&1
  python3 - /tmp/${k}_raw.csv > $O/${k}_stalls.txt <<'PY'
import csv,sys
rows=list(csv.reader(open(sys.argv[1])))
h=rows[0]; vals=rows[-1]
for n,v in zip(h,vals):
    if any(s in n for s in ("stalled","gpu__time_duration.sum","sm__cycles_elapsed.avg","smsp__inst_executed.sum","issue_active","warps_active")): print(n, v)
PY
  ncu -i /tmp/$k.ncu-rep --page source --csv --print-source cuda,sass > /tmp/${k}_src.csv 2>$O/${k}_src_err.txt || \
    ncu -i /tmp/$k.ncu-rep --page source --csv --print-source sass > /tmp/${k}_src.csv 2>>$O/${k}_src_err.txt
  gzip -c /tmp/${k}_src.csv > $O/${k}_src.csv.gz; ls -la /tmp/${k}_src.csv /tmp/$k.ncu-rep
  cp /tmp/$k.ncu-rep $O/ 2>/dev/null
  el ncu $k
done
(cd dev/cuda && timeout 200 ./delta_chunk 11 --no-validate > $O/lab_v11_time.txt 2>&1); echo "lab v11 time rc $?"; tail -30 $O/lab_v11_time.txt; el all
