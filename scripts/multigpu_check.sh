#!/usr/bin/env bash
# Multi-GPU check and benchmark (issue 5), on one node with at least 2 NVIDIA GPUs and Open MPI's mpirun:
#   1. the same total batch on 1 GPU (2 accumulation steps) and on 2 GPUs (1 micro-batch each): 20 steps of loss,
#      max relative difference; FP32 build within 1e-5, BF16 within 2e-3 (README: "Many GPUs" says why);
#   2. resume on 2 GPUs from step 10 reproduces the uninterrupted 2-GPU run bit for bit (losses, checkpoint, state);
#   3. the 2-GPU step-10 checkpoint resumes on 1 GPU (same -b and -d) and follows the 2-GPU losses within 2e-3;
#   4. the TCP and the file rendezvous (no mpirun) give the mpirun run's losses bit for bit;
#   5. a rank killed mid-run ends the other with exit 5 (watchdog, --dist-timeout 30) instead of a hang;
#   6. scaling: pgdn-340m at 16 x 2048 tokens per GPU, tokens/s on 1 and 2 GPUs and the communication per step.
# Prints a table last. Usage: scripts/multigpu_check.sh [OUTDIR]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/pdn_multigpu}
rm -rf "$out" && mkdir -p "$out"
make -s train_pdncu train_pdncu_fp32 || exit 1
mpi=(mpirun -np 2 --bind-to none)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
for v in $(env | grep -o '^NCCL_[A-Z_]*'); do mpi+=(-x "$v"); done   # NCCL settings reach every rank
job=(--preset pgdn-tiny -b 8 -t 64 -d 1024 --mqar-pairs 4 -x 20 -n 10 -v 10 -m 2)   # 2 micro-batches of 8 x 64 per step
rows=()
row() { rows+=("$(printf "%-52s | %s" "$1" "$2")"); }
losses() { sed -n 's/^s:\([0-9]*\) trl:\([^ ]*\) .*/\1 \2/p' "$1/main.log" | awk -v a="${2:-1}" -v b="${3:-100000}" '$1 >= a && $1 <= b'; }
maxrel() { paste <(losses "$1" "$3" "$4") <(losses "$2" "$3" "$4") | awk '{ d = $2 - $4; d = d < 0 ? -d : d; r = d / ($2 < 0 ? -$2 : $2);
           if (r > m) m = r; n++ } END { if (n == 0) print "nan"; else printf "%.2e\n", m }'; }
verdict() { awk -v x="$1" -v t="$2" 'BEGIN { print (x != "nan" && x + 0 <= t + 0) ? "PASS" : "FAIL" }'; }

# 1. 1 GPU vs 2 GPUs, same total batch
for bin in train_pdncu_fp32 train_pdncu; do
    tol=2e-3; [ $bin = train_pdncu_fp32 ] && tol=1e-5
    ./$bin "${job[@]}" -o "$out/$bin.1gpu" > "$out/$bin.1gpu.txt" 2>&1 || echo "FAILED: $bin on 1 GPU"
    "${mpi[@]}" ./$bin "${job[@]}" -o "$out/$bin.2gpu" > "$out/$bin.2gpu.txt" 2>&1 || echo "FAILED: $bin on 2 GPUs"
    r=$(maxrel "$out/$bin.1gpu" "$out/$bin.2gpu" 1 20)
    row "$bin: 20 losses, 1 GPU x 2 micro vs 2 GPUs x 1" "max rel diff $r (tol $tol) $(verdict "$r" $tol)"
    echo "== $bin: step, loss on 1 GPU, loss on 2 GPUs =="
    paste <(losses "$out/$bin.1gpu") <(losses "$out/$bin.2gpu") | awk '{ printf "%3d %.9f %.9f\n", $1, $2, $4 }'
done
two="$out/train_pdncu.2gpu"
# 2. resume on 2 GPUs from step 10
mkdir -p "$out/res2" && cp "$two/model_00000010.bin" "$two/state_00000010.bin" "$out/res2/"
"${mpi[@]}" ./train_pdncu "${job[@]}" -o "$out/res2" -y 1 > "$out/res2.txt" 2>&1 || echo "FAILED: resume on 2 GPUs"
same=FAIL
if [ -n "$(losses "$two" 11 20)" ] && [ "$(losses "$two" 11 20)" = "$(losses "$out/res2" 11 20)" ] &&
   cmp -s "$two/model_00000020.bin" "$out/res2/model_00000020.bin" && cmp -s "$two/state_00000020.bin" "$out/res2/state_00000020.bin"; then
    same=PASS
fi
row "resume 2 GPUs from step 10: losses 11-20, files" "bit-exact $same"
# 3. the 2-GPU checkpoint on 1 GPU
mkdir -p "$out/res1" && cp "$two/model_00000010.bin" "$two/state_00000010.bin" "$out/res1/"
./train_pdncu "${job[@]}" -o "$out/res1" -y 1 > "$out/res1.txt" 2>&1 || echo "FAILED: 2-GPU checkpoint on 1 GPU"
r=$(maxrel "$two" "$out/res1" 11 20)
row "2-GPU checkpoint resumed on 1 GPU: losses 11-20" "max rel diff vs 2 GPUs $r (tol 2e-3) $(verdict "$r" 2e-3)"
# 4. rendezvous without MPI
port=$((29000 + RANDOM % 1000))
for how in tcp file; do
    if [ $how = tcp ]; then meet=(--dist-host 127.0.0.1 --dist-port $port); else meet=(--dist-dir "$out/rdzv"); fi
    for r in 1 0; do
        ./train_pdncu "${job[@]}" --world-size 2 --rank $r "${meet[@]}" -o "$out/$how" > "$out/$how.$r.txt" 2>&1 &
    done
    wait
    same=FAIL
    [ -n "$(losses "$two")" ] && [ "$(losses "$two")" = "$(losses "$out/$how")" ] && same=PASS
    row "$how rendezvous (no mpirun): 20 losses vs mpirun" "bit-exact $same"
done
# 5. a rank dies
./train_pdncu --preset pgdn-tiny -b 8 -t 64 -x 1000000 -v 0 --world-size 2 --rank 0 --dist-host 127.0.0.1 --dist-port $((port + 1)) \
    --dist-timeout 30 > "$out/dead.0.txt" 2>&1 &
p0=$!
./train_pdncu --preset pgdn-tiny -b 8 -t 64 -x 1000000 -v 0 --world-size 2 --rank 1 --dist-host 127.0.0.1 --dist-port $((port + 1)) \
    --dist-timeout 30 > "$out/dead.1.txt" 2>&1 &
p1=$!
sleep 20; kill -9 $p1; t0=$(date +%s)
wait $p0; rc=$?; t1=$(date +%s)
row "rank 1 killed: rank 0 ends by itself" "exit $rc after $((t1 - t0)) s (want 5) $([ $rc = 5 ] && echo PASS || echo FAIL): $(grep -m1 error "$out/dead.0.txt" | cut -c1-90)"
# 6. scaling
big=(--preset pgdn-340m -b 16 -t 2048 -x 8 -v 0 -m 1)
./train_pdncu "${big[@]}" > "$out/scale.1.txt" 2>&1
"${mpi[@]}" ./train_pdncu "${big[@]}" > "$out/scale.2.txt" 2>&1
t1=$(sed -n 's/.*; \([0-9]*\) tok\/s averaged.*/\1/p' "$out/scale.1.txt")
t2=$(sed -n 's/.*; \([0-9]*\) tok\/s averaged.*/\1/p' "$out/scale.2.txt")
row "pgdn-340m, 16 x 2048 per GPU: tok/s 1 GPU | 2 GPUs" "$t1 | $t2 = $(awk -v a="$t1" -v b="$t2" 'BEGIN { if (a > 0) printf "%.3fx", b / a }') (want >= 1.9x)"
comm=$(grep -m1 "communication per step" "$out/scale.2.txt")
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x $(nvidia-smi -L | wc -l), $(date -u +%Y-%m-%d) =="
echo "${comm:-no communication line (the 2-GPU run failed? see $out/scale.2.txt)}"
printf '%s\n' "${rows[@]}"
