#!/usr/bin/env bash
# session 18 call 3: stage_async by shifts + three-stage scans (this tree) vs main 7289c74 (.build/old):
# lab validation (every version), bitcmp, lab timing v6/v11/v12 old and new alternating, A/B end to end, pgdn 1x32768 profile
set -uo pipefail
O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
OLD=.build/old
(make -s train_pdncu > /tmp/b1.txt 2>&1; echo "new build rc $?") & p1=$!
(make -s -C $OLD train_pdncu > /tmp/b2.txt 2>&1; echo "old build rc $?") & p2=$!
(make -s -C dev/cuda delta_chunk > /tmp/b3.txt 2>&1; echo "lab build rc $?") & p3=$!
(make -s -C $OLD/dev/cuda delta_chunk > /tmp/b4.txt 2>&1; echo "old lab build rc $?") & p4=$!
wait $p1 $p2 $p3 $p4; cat /tmp/b?.txt > $O/build.txt; el builds
cuobjdump -res-usage train_pdncu 2>&1 | grep -A1 "state_\(forward\|backward\)_wmma_kernelILi[123]ELi16" | grep -o "REG:[0-9]*\|STACK:[0-9]*\|LOCAL:[0-9]*" | paste - - - | head -6
(cd dev/cuda && timeout 240 ./delta_chunk --no-bench > $O/lab_validate.txt 2>&1; echo "lab validate rc $?"; tail -1 $O/lab_validate.txt)
grep -E '^FAIL' $O/lab_validate.txt | head -5; grep -c "v12" $O/lab_validate.txt; el validate
scripts/bitcmp.sh $OLD train_pdncu > $O/bitcmp.txt 2>&1; echo "bitcmp rc $?"
cut -c1-60 $O/bitcmp.txt | grep -E "IDENTICAL|DIFFERENT" | sort | uniq -c | head; el bitcmp
for i in 1 2; do
  for v in 6 11; do (cd $OLD/dev/cuda && ./delta_chunk $v --no-validate 2>&1 | grep "^v$v " | sed 's/^/old /') >> $O/lab_time.txt; done
  for v in 6 12 11; do (cd dev/cuda && ./delta_chunk $v --no-validate 2>&1 | grep "^v$v " | sed 's/^/new /') >> $O/lab_time.txt; done
done
el lab
python3 - $O/lab_time.txt <<'PY' | tee $O/lab_table.txt
import sys,collections
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
    f=l.split()
    who=f[0]; ver=f[1]
    i=[k for k,x in enumerate(f) if x in ("dn","pdn","gdn","pgdn","kda","pkda")][0]
    var=f[i]; B=f[i+1]; T=f[i+2]; fw=float(f[i+3]); fb=float(f[i+4])
    d[(var,int(B),int(T))].append((who+" "+ver,fw,fb))
print("fwd+bwd ms (fwd ms), mean of 2; columns:", "old v6 | new v6 | new v12 | old v11 | new v11")
for k in sorted(d):
    g=collections.defaultdict(list)
    for w,fw,fb in d[k]: g[w].append((fw,fb))
    cell=lambda w: (lambda L: f"{sum(x[1] for x in L)/len(L):.3f} ({sum(x[0] for x in L)/len(L):.3f})")(g[w]) if g[w] else "-"
    print(f"{k[0]:5} {k[1]:>2} {k[2]:>6} | "+" | ".join(cell(w) for w in ("old v6","new v6","new v12","old v11","new v11")))
PY
REPS=2 scripts/ab_gpu.sh $OLD pgdn-340m:1x32768 pgdn-340m kda-340m:1x32768 > $O/ab.txt 2>&1; echo "ab rc $?"; tail -5 $O/ab.txt; el ab
d=$(mktemp -d); scripts/random_shard.sh $d/rand_train_000.bin > /dev/null
PDN_PROFILE=1 ./train_pdncu --preset pgdn-340m -i "$d/rand_train_*.bin" -b 1 -t 32768 -d 32768 -x 6 -v 0 -m 1 2>&1 \
  | sed -n '/mixer kernels/p;/where the time goes/,/total/p' > $O/profile_pgdn_1x32768.txt
grep -E "mixer kernels|scan|total" $O/profile_pgdn_1x32768.txt | cut -c1-200 | head; el all
