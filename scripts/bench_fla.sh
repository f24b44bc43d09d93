#!/usr/bin/env bash
# scripts/bench_fla.sh: train_pdncu against fla's model of the same preset, same job, same data (issue 13's "fla"
# column), on the GPU machine. What is measured and how: scripts/bench_fla.py's docstring.
#
#   FLA_DIR=.fla scripts/bench_fla.sh [--variants dn,gdn,pgdn,kda,pkda] [--shapes 16x2048,1x32768] [--size 340m|1b]
#                                     [--steps 6] [--warmup 2]
# FLA_DIR (default .fla): an fla source tree (the directory that holds fla/); python3 needs torch with CUDA, triton,
# transformers, numpy and einops. fla autotunes its Triton kernels on the first step of every shape: minutes, once.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/fla_env.sh "torch, transformers, einops, triton, numpy"
make -s train_pdn train_pdncu
work=$(mktemp -d /tmp/pdn_bench_fla_XXXXXX)
trap 'rm -rf "$work"' EXIT
scripts/random_shard.sh "$work/rand_train_000.bin"
"$PYTHON" scripts/bench_fla.py --shard "$work/rand_train_000.bin" --work "$work" "$@"
