#!/usr/bin/env bash
# session 17: the fast sigmoid + conv backward + FIN prefetch (new tree; .build/pf the prefetch alone) against main f43016e (.build/old), one job:
# conv lab (bf16 and fp32 validation, v6 timing old vs new), A/B end to end, lab v11's first validation, pgdn 1x32768 profile
set -uo pipefail
O=${OUT:-/tmp/out}; mkdir -p $O

nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
OLD=.build/old
(make -s train_pdncu > /tmp/b1.txt 2>&1; echo "new build rc $?") &
(make -s -C $OLD train_pdncu > /tmp/b2.txt 2>&1; echo "old build rc $?") &
(make -s -C dev/cuda conv_norm conv_norm_fp32 > /tmp/b3.txt 2>&1; echo "lab builds rc $?") &
(make -s -C $OLD/dev/cuda conv_norm > /tmp/b4.txt 2>&1; echo "old lab build rc $?") &
(make -s -C dev/cuda delta_chunk > /tmp/b5.txt 2>&1; echo "delta_chunk build rc $?") &
(make -s -C .build/pf train_pdncu > /tmp/b6.txt 2>&1; echo "pf build rc $?") &
wait; cat /tmp/b?.txt > $O/build.txt; el builds
(cd dev/cuda && ./conv_norm --no-bench > $O/conv_validate_bf16.txt 2>&1; echo "conv bf16 validate rc $?"; tail -1 $O/conv_validate_bf16.txt)
(cd dev/cuda && ./conv_norm_fp32 --no-bench > $O/conv_validate_fp32.txt 2>&1; echo "conv fp32 validate rc $?"; tail -1 $O/conv_validate_fp32.txt)
grep -hE '^FAIL' $O/conv_validate_*.txt | head -5
for i in 1 2; do
  (cd $OLD/dev/cuda && ./conv_norm 6 2>&1 | sed -n '/timing/,$p' | sed 's/^/old /') >> $O/conv_time.txt
  (cd dev/cuda && ./conv_norm 6 2>&1 | sed -n '/timing/,$p' | sed 's/^/new /') >> $O/conv_time.txt
done
grep -iE "v6|fwd|bwd" $O/conv_time.txt | head -20; el conv
(cd .build/pf && scripts/bitcmp.sh ../old train_pdncu > $O/bitcmp_pf.txt 2>&1; echo "bitcmp (prefetch alone vs main) rc $?")
cut -c1-60 $O/bitcmp_pf.txt | grep -E "IDENTICAL|DIFFERENT" | sort | uniq -c | head; el bitcmp
REPS=2 scripts/ab_gpu.sh $OLD pgdn-340m kda-340m gdn-340m > $O/ab.txt 2>&1; echo "ab rc $?"; tail -6 $O/ab.txt; el ab
(cd dev/cuda && ./delta_chunk 11 --no-bench > $O/lab_v11_validate.txt 2>&1); echo "lab v11 validate rc $?"
tail -1 $O/lab_v11_validate.txt; grep -E '^FAIL' $O/lab_v11_validate.txt | head -3; el v11
d=$(mktemp -d); scripts/random_shard.sh $d/rand_train_000.bin > /dev/null
PDN_PROFILE=1 ./train_pdncu --preset pgdn-340m -i "$d/rand_train_*.bin" -b 1 -t 32768 -d 32768 -x 6 -v 0 -m 1 2>&1 \
  | sed -n '/where the time goes/,/total/p' > $O/profile_pgdn_1x32768.txt
cat $O/profile_pgdn_1x32768.txt; el all
