#!/usr/bin/env bash
# The kernel lab in one go (needs an NVIDIA GPU): builds every lab binary (make -C dev/cuda), runs each bf16 binary
# (validation of every version against its CPU reference, then timing) and each fp32 binary (validation only: the
# 1e-4 exactness check of the same code), then prints one summary: a row per binary (checks, failures, exit code,
# seconds) followed by every timing table. Exit code 0 only if every binary ran and every check passed.
# Usage: dev/cuda/run_all.sh [LOGDIR]    (logs: LOGDIR, else $OUT/lab when $OUT is set, else /tmp/pdn_lab)
#        LAB_TIMEOUT=SECONDS caps each binary (default 240); GPU_ARCH=sm_90 is passed to make.
set -uo pipefail
cd "$(dirname "$0")" || exit 1
logdir=${1:-}
if [ -z "$logdir" ]; then logdir=${OUT:+$OUT/lab}; logdir=${logdir:-/tmp/pdn_lab}; fi
mkdir -p "$logdir"
limit=${LAB_TIMEOUT:-240}

echo "building (make -C dev/cuda GPU_ARCH=${GPU_ARCH:-sm_90}) ..."
t0=$(date +%s)
if ! make -j8 GPU_ARCH="${GPU_ARCH:-sm_90}" all > "$logdir/build.log" 2>&1; then
    cat "$logdir/build.log"
    echo "run_all: the build failed"
    exit 1
fi
if grep -qi "warning" "$logdir/build.log"; then grep -i "warning" "$logdir/build.log" | head -20; fi
echo "built in $(( $(date +%s) - t0 )) s"

# binary and its arguments
runs=(
    "delta_chunk"
    "delta_chunk_fp32 --no-bench"
    "precond_scan"
    "precond_scan_fp32 --no-bench"
    "rmsnorm"
    "rmsnorm_fp32 --no-bench"
    "classifier"
    "classifier_fp32 --no-bench"
    "conv_norm"
    "conv_norm_fp32 --no-bench"
    "attention"
    "attention_fp32 --no-bench"
    "gates"
    "gates_fp32 --no-bench"
)
rows=()
status=0
for r in "${runs[@]}"; do
    read -r -a argv <<< "$r"
    bin=${argv[0]}
    log=$logdir/$bin.log
    echo
    echo "################ ./$r"
    s0=$(date +%s.%N)
    timeout "$limit" "./$bin" "${argv[@]:1}" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    s1=$(date +%s.%N)
    secs=$(awk -v a="$s0" -v b="$s1" 'BEGIN { printf "%.1f", b - a }')
    checks=$(grep -cE '^(PASS|FAIL)' "$log")
    failed=$(grep -cE '^FAIL' "$log")
    note=""
    [ "$rc" -eq 124 ] && note="timed out after ${limit} s"
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 1 ] && note="exited with $rc (crash or CUDA error: see $log)"
    grep -q '^RESULT' "$log" || note="${note:-no RESULT line: did not finish}"
    verdict=PASS
    if [ "$rc" -ne 0 ] || [ "$failed" -ne 0 ] || [ "$checks" -eq 0 ]; then verdict=FAIL; status=1; fi
    rows+=("$(printf '%-30s %6s %7s %7s %5s %8s  %s' "$r" "$verdict" "$checks" "$failed" "$rc" "$secs" "$note")")
done

echo
echo "================================ dev/cuda summary ================================"
printf '%-30s %6s %7s %7s %5s %8s\n' "binary" "result" "checks" "failed" "exit" "seconds"
for row in "${rows[@]}"; do echo "$row"; done
failures=$(grep -hE '^FAIL' "$logdir"/*.log 2>/dev/null | head -40)
if [ -n "$failures" ]; then
    echo
    echo "failed checks:"
    echo "$failures"
fi
echo
for r in "${runs[@]}"; do
    bin=${r%% *}
    # each timing table runs from its "=== timing" header to the next blank line
    awk '/^=== timing/ { p = 1 } p && /^$/ { p = 0; print "" } p' "$logdir/$bin.log"
done
echo "logs: $logdir"
if [ "$status" -eq 0 ]; then echo "run_all: PASS"; else echo "run_all: FAIL"; fi
exit $status
