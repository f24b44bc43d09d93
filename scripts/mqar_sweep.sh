#!/usr/bin/env bash
# MQAR as Zoology runs it (--mqar-gen zoology), swept like the paper's Fig. 5: accuracy against the sequence length L
# at N = 64 key-value pairs and at N = L/8, for dn pdn gdn pgdn kda pkda, a small learning-rate grid (the best per
# cell, as Zoology reports it) and several seeds (mean +- std). README "MQAR as Zoology runs it" says what was chosen
# and why.
#
#   scripts/mqar_sweep.sh OUTDIR            the default grid on one GPU (train_pdncu): one cell (L 256, N 32), 3 seeds, every
#                                           variant, each run after the easy cell (L 64, N 4): ~5 minutes on an H200
#                                           (measured 2026-12-03: 18 runs, 6 at a time, in 284 s)
#   FULL=1 scripts/mqar_sweep.sh OUTDIR     the full grid (the 7 cells of Fig. 5, 3 learning rates, 3 seeds): ~5 h on one H200
#   SMOKE=1 scripts/mqar_sweep.sh OUTDIR    a tiny grid on the CPU (train_pdn): every variant, one length, one seed
#
# Writes OUTDIR/runs.tsv (one line per run), OUTDIR/summary.tsv and summary.md (best lr per cell, mean +- std over
# the seeds, preconditioned vs baseline), OUTDIR/mqar.png (scripts/mqar_plot.sh) and OUTDIR/logs/. Runs already in
# runs.tsv are skipped, so the same command continues an interrupted sweep; BUDGET_S=S stops starting new runs after
# S seconds (exit 3: run the same command again to continue). Every setting below can be overridden from the
# environment, e.g. LRS="1e-3 3e-3" SEEDS="1 2 3 4 5" JOBS=4 GPUS=0,1 scripts/mqar_sweep.sh out.
# Exit: 0 done, 1 bad settings, 2 some runs failed (OUTDIR/failures.tsv), 3 budget reached, 4 no plot (no gnuplot).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:-}
if [ -z "$OUT" ] || [ $# -ne 1 ]; then
    echo "usage: [SMOKE=1 | FULL=1] [VAR=value ...] scripts/mqar_sweep.sh OUTDIR" >&2
    exit 1
fi

SMOKE=${SMOKE:-0}
FULL=${FULL:-0}
if [ "$SMOKE" = 1 ]; then
    # the CPU, in under two minutes on 2 cores: a d 32 model, vocab 64, L 32 with N = 2 and N = L/8 = 4. One
    # OpenMP thread per run and two runs at a time: on a shared 2-core machine OpenMP barriers over oversubscribed
    # cores cost more than they save.
    : "${TRAINER:=./train_pdn}" "${LENGTHS:=32}" "${NFIX:=2}" "${RATIO:=8}" "${LRS:=1e-2}" "${SEEDS:=1}"
    : "${STEPS:=150}" "${TOKENS:=512}" "${D_MODEL:=32}" "${HEADS:=2}" "${HEAD_DIM:=16}" "${VOCAB:=64}"
    : "${TEST_EX:=128}" "${EVAL_EVERY:=50}" "${JOBS:=2}" "${THREADS:=1}" "${BUDGET_S:=0}"
else
    # the GPU: a 2-layer d 128 model with 4 heads of 32, Zoology's vocabulary of 8192, 32,768 tokens a step; every run
    # first up to 600 steps at the easy cell (L 64, N 4), then 4,000 steps at its own (without the easy cell first the
    # plateau before recall is found lasted 4,000-6,000 steps at L 256: README); six trainers share the GPU
    : "${TRAINER:=./train_pdncu}" "${RATIO:=8}" "${TOKENS:=32768}" "${D_MODEL:=128}" "${HEADS:=4}" "${HEAD_DIM:=32}"
    : "${VOCAB:=8192}" "${TEST_EX:=1000}" "${STEPS:=4000}" "${EVAL_EVERY:=500}" "${JOBS:=6}" "${THREADS:=0}"
    : "${WARM_STEPS:=600}"
    if [ "$FULL" = 1 ]; then
        : "${LENGTHS:=256 512 1024 2048}" "${NFIX:=64}" "${LRS:=1e-3 3e-3 1e-2}" "${SEEDS:=1 2 3}" "${BUDGET_S:=0}"
    else
        : "${LENGTHS:=256}" "${NFIX:=32}" "${LRS:=3e-3}" "${SEEDS:=1 2 3}" "${BUDGET_S:=560}"
    fi
fi
: "${VARIANTS:=dn pdn gdn pgdn kda pkda}" "${N_LAYER:=2}" "${TRAIN_EX:=100000}" "${STOP_ACC:=0.99}"
: "${WARMUP:=$((STEPS / 20))}" "${WD:=0.1}" "${GPUS:=}"
# The easy cell first (WARM_STEPS > 0): every run starts with up to WARM_STEPS steps at (WARM_L, WARM_N), early stop
# included, and its cell's run starts from that checkpoint (-e). Zoology's example MQAR configs serve this cell's
# examples ahead of the harder ones in every epoch; README "MQAR as Zoology runs it" says why it is here.
: "${WARM_STEPS:=0}" "${WARM_L:=64}" "${WARM_N:=4}"

die() { echo "mqar_sweep: $*" >&2; exit 1; }
case "$TRAINER" in
    *train_pdncu*) GPU=1 ;;
    *) GPU=0 ;;
esac
for n in STEPS TOKENS D_MODEL HEADS HEAD_DIM VOCAB TEST_EX TRAIN_EX EVAL_EVERY JOBS NFIX RATIO N_LAYER WARM_L WARM_N; do
    v=${!n}
    [[ "$v" =~ ^[0-9]+$ ]] && [ "$v" -ge 1 ] || die "$n must be a positive integer, got '$v'"
done
[[ "$WARM_STEPS" =~ ^[0-9]+$ ]] || die "WARM_STEPS must be a number of steps (0: no easy cell first), got '$WARM_STEPS'"
[ "$WARM_STEPS" = 0 ] || [ $((TOKENS % WARM_L)) = 0 ] || die "TOKENS=$TOKENS is not a multiple of WARM_L=$WARM_L"
[[ "$BUDGET_S" =~ ^[0-9]+$ ]] || die "BUDGET_S must be a number of seconds (0: no budget), got '$BUDGET_S'"

# the cells: (L, N = NFIX) where it fits (4N <= L) and (L, N = L / RATIO); a cell in both families is run once
CELLS=()
add_cell() { local c; for c in "${CELLS[@]:-}"; do [ "$c" = "$1 $2" ] && return; done; CELLS+=("$1 $2"); }
for L in $LENGTHS; do
    [[ "$L" =~ ^[0-9]+$ ]] && [ $((L % 2)) = 0 ] || die "every length must be even (Zoology's generator), got '$L'"
    [ $((TOKENS % L)) = 0 ] || die "TOKENS=$TOKENS is not a multiple of L=$L (the batch is TOKENS / L sequences)"
    [ "$VOCAB" -gt "$L" ] || die "VOCAB=$VOCAB must exceed every length (Zoology's generator asserts V > L), got L=$L"
    if [ $((4 * NFIX)) -le "$L" ]; then add_cell "$L" "$NFIX"; fi
    if [ $((L % RATIO)) = 0 ] && [ $((L / RATIO)) -ge 1 ]; then add_cell "$L" $((L / RATIO)); fi
done
[ ${#CELLS[@]} -gt 0 ] || die "no (L, N) cell fits: N = $NFIX needs L >= $((4 * NFIX))"
for v in $VARIANTS; do case "$v" in dn|pdn|gdn|pgdn|kda|pkda) ;; *) die "unknown variant '$v'" ;; esac; done

# the trainer
if [ ! -x "$TRAINER" ]; then
    echo "building $TRAINER"
    make "$(basename "$TRAINER")" >/dev/null
fi

mkdir -p "$OUT/logs"
# what makes runs comparable: a directory holds one setting (the grid lists may grow between calls)
IDENT="trainer=$(basename "$TRAINER") steps=$STEPS tokens=$TOKENS layers=$N_LAYER d_model=$D_MODEL heads=$HEADS head_dim=$HEAD_DIM"
IDENT+=" vocab=$VOCAB train=$TRAIN_EX test=$TEST_EX eval_every=$EVAL_EVERY stop_acc=$STOP_ACC warmup=$WARMUP wd=$WD"
IDENT+=" nfix=$NFIX ratio=$RATIO"
[ "$WARM_STEPS" = 0 ] || IDENT+=" warm_steps=$WARM_STEPS warm_l=$WARM_L warm_n=$WARM_N"
if [ -f "$OUT/sweep.env" ]; then
    old=$(grep '^IDENT=' "$OUT/sweep.env" | cut -d= -f2- | tr -d "'")
    [ "$old" = "$IDENT" ] || die "$OUT holds a sweep with other settings:
  there: $old
  now:   $IDENT
  hint: use another OUTDIR, or the same settings to continue it"
fi
cat > "$OUT/sweep.env" <<EOF
IDENT='$IDENT'
NFIX=$NFIX
RATIO=$RATIO
LENGTHS='$LENGTHS'
VARIANTS='$VARIANTS'
D_MODEL=$D_MODEL
HEADS=$HEADS
HEAD_DIM=$HEAD_DIM
N_LAYER=$N_LAYER
VOCAB=$VOCAB
STEPS=$STEPS
TOKENS=$TOKENS
DEVICE='$([ "$GPU" = 1 ] && (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo GPU) || (lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1))'
DATE='$(date -u +%Y-%m-%d)'
EOF
RUNS="$OUT/runs.tsv"
FAILS="$OUT/failures.tsv"
[ -f "$RUNS" ] || printf 'variant\tL\tN\td_model\tn_head\thead_dim\tbatch\tlr\tseed\tsteps\tmax_steps\taccuracy\tval_loss\tseconds\tstatus\twarm_steps\twarm_accuracy\n' > "$RUNS"

# the job list: seeds outermost, so a partial sweep already has every cell at its first seeds
JOBLIST="$OUT/.jobs"
: > "$JOBLIST"
total=0
for seed in $SEEDS; do for lr in $LRS; do for cell in "${CELLS[@]}"; do for v in $VARIANTS; do
    set -- $cell
    if ! awk -F'\t' -v v="$v" -v L="$1" -v N="$2" -v lr="$lr" -v s="$seed" \
        'NR > 1 && $1 == v && $2 == L && $3 == N && $8 == lr && $9 == s { found = 1 } END { exit !found }' "$RUNS"; then
        echo "$v $1 $2 $lr $seed" >> "$JOBLIST"
    fi
    total=$((total + 1))
done; done; done; done
todo=$(wc -l < "$JOBLIST")
echo "MQAR sweep (Zoology's generator) into $OUT: ${#CELLS[@]} cells (L N: $(printf '%s, ' "${CELLS[@]}" | sed 's/, $//')) x" \
     "$(echo $VARIANTS | wc -w) variants x $(echo $LRS | wc -w) lr x $(echo $SEEDS | wc -w) seeds = $total runs, $todo to do;" \
     "$N_LAYER layers, d $D_MODEL, $HEADS heads of $HEAD_DIM, vocab $VOCAB, $STEPS steps of $TOKENS tokens, $JOBS at a time"

# GPUs for the workers: GPUS=0,1,... or every GPU nvidia-smi lists; worker w takes GPU w mod their number
GPU_LIST=()
if [ "$GPU" = 1 ]; then
    if [ -n "$GPUS" ]; then IFS=, read -r -a GPU_LIST <<< "$GPUS"
    else
        n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
        for ((i = 0; i < (n > 0 ? n : 1); i++)); do GPU_LIST+=("$i"); done
    fi
fi

START=$(date +%s)
append() { # one line, under a lock when flock exists (a short append is atomic anyway)
    if command -v flock >/dev/null 2>&1; then flock "$OUT/.lock" sh -c 'printf "%s\n" "$1" >> "$2"' _ "$1" "$2"
    else printf '%s\n' "$1" >> "$2"; fi
}

run_one() { # variant L N lr seed
    local v=$1 L=$2 N=$3 lr=$4 seed=$5 B=$((TOKENS / $2))
    local key="${v}_L${L}_N${N}_lr${lr}_s${seed}" log="$OUT/logs/${1}_L${2}_N${3}_lr${4}_s${5}.log"
    local common=(--n-layer "$N_LAYER" --d-model "$D_MODEL" --n-head "$HEADS" --head-dim "$HEAD_DIM"
                --vocab "$VOCAB" --tie 1 --mqar-gen zoology --mqar-vocab "$VOCAB"
                --mqar-train "$TRAIN_EX" --mqar-test "$TEST_EX" --mqar-data-seed "$seed" --seed "$seed"
                -l "$lr" -q 0 -c "$WD" --beta2 0.999 -v "$EVAL_EVERY" --mqar-stop-acc "$STOP_ACC")
    [ "$GPU" = 1 ] || common+=(--mixer token --threads "$THREADS")
    local args=(--preset "$v-tiny" "${common[@]}" --mqar-pairs "$N" -t "$L" -b "$B" -x "$STEPS" -u "$WARMUP")
    local t0 t1 rc=0 wsteps=0 wacc=- wdir="$OUT/warm/$key"
    t0=$(date +%s.%N)
    if [ "$WARM_STEPS" -gt 0 ]; then # the easy cell first, then this cell from its last checkpoint
        rm -rf "$wdir"
        "$TRAINER" --preset "$v-tiny" "${common[@]}" --mqar-pairs "$WARM_N" -t "$WARM_L" -b $((TOKENS / WARM_L)) \
            -x "$WARM_STEPS" -u $((WARM_STEPS / 20)) -o "$wdir" > "${log%.log}.warm.log" 2>&1 || rc=$?
        wsteps=$(sed -n 's/^done: \([0-9]*\) steps.*/\1/p' "${log%.log}.warm.log" | tail -1)
        wacc=$(sed -n 's/^val | step [0-9]* | loss [^ ]* | recall accuracy \([0-9.]*\)%.*/\1/p' "${log%.log}.warm.log" | tail -1)
        local ck
        ck=$(ls "$wdir"/model_*.bin 2>/dev/null | tail -1)
        if [ "$rc" = 0 ] && [ -n "$ck" ]; then args=(-e "$ck" "${args[@]:2}")
        else [ "$rc" = 0 ] && rc=1; log="${log%.log}.warm.log"; fi
    fi
    [ "$rc" = 0 ] && { "$TRAINER" "${args[@]}" > "$log" 2>&1 || rc=$?; }
    rm -rf "$wdir"
    t1=$(date +%s.%N)
    local secs acc vl steps status
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    acc=$(sed -n 's/^val | step [0-9]* | loss [^ ]* | recall accuracy \([0-9.]*\)%.*/\1/p' "$log" | tail -1)
    vl=$(sed -n 's/^val | step [0-9]* | loss \([^ ]*\) | recall.*/\1/p' "$log" | tail -1)
    steps=$(sed -n 's/^done: \([0-9]*\) steps.*/\1/p' "$log" | tail -1)
    if [ "$rc" = 0 ] && [ -n "$acc" ] && [ -n "$steps" ]; then status=ok
    elif [ "$rc" = 3 ]; then # diverged (NaN loss): the run learned nothing usable; it scores 0 in its cell
        status=diverged; acc=0; vl=nan; steps=$(grep -c '^step ' "$log" || true)
    else
        append "$(printf '%s\t%s\t%s\t%s\t%s\trc=%s\t%s' "$v" "$L" "$N" "$lr" "$seed" "$rc" "$log")" "$FAILS"
        echo "FAILED $key (exit $rc): $(tail -1 "$log")" >&2
        return
    fi
    append "$(printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s' "$v" "$L" "$N" "$D_MODEL" "$HEADS" \
        "$HEAD_DIM" "$B" "$lr" "$seed" "$steps" "$STEPS" "$acc" "$vl" "$secs" "$status" "${wsteps:-0}" "${wacc:--}")" "$RUNS"
    local done_now elapsed
    done_now=$(($(wc -l < "$RUNS") - 1))
    elapsed=$(($(date +%s) - START))
    echo "[$done_now/$total] $key: $acc% after $steps steps, ${secs} s ($status); ${elapsed} s into this call"
}

worker() { # worker w of JOBS: jobs w, w + JOBS, ...
    local w=$1 i=0 line
    [ "$GPU" = 1 ] && export CUDA_VISIBLE_DEVICES=${GPU_LIST[$((w % ${#GPU_LIST[@]}))]}
    while read -r line; do
        if [ $((i % JOBS)) = "$w" ]; then
            if [ "$BUDGET_S" -gt 0 ] && [ $(($(date +%s) - START)) -ge "$BUDGET_S" ]; then return; fi
            run_one $line
        fi
        i=$((i + 1))
    done < "$JOBLIST"
}

rm -f "$FAILS"   # failed runs are not in runs.tsv: this call tries them again
pids=()
for ((w = 0; w < JOBS; w++)); do worker "$w" & pids+=($!); done
for p in "${pids[@]}"; do wait "$p"; done
rm -f "$JOBLIST" "$OUT/.lock"; rmdir "$OUT/warm" 2>/dev/null || true

done_runs=$(($(wc -l < "$RUNS") - 1))
echo "runs in $RUNS: $done_runs of $total; this call took $(($(date +%s) - START)) s"
code=0
plot_rc=0
scripts/mqar_plot.sh "$OUT" || plot_rc=$?
if [ -s "$FAILS" ]; then
    echo "some runs failed: $FAILS lists them (their logs say why); they run again with the same command" >&2
    code=2
elif [ "$done_runs" -lt "$total" ]; then
    echo "BUDGET_S=$BUDGET_S reached: $((total - done_runs)) runs left; run the same command again to continue" >&2
    code=3
fi
if [ "$plot_rc" != 0 ] && [ "$code" = 0 ]; then code=4; fi
exit $code
