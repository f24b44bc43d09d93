#!/usr/bin/env bash
# scripts/check_fla_export.sh: pdn.c's --export-hf / --import-hf checked against fla itself, on the GPU machine.
#
#   FLA_DIR=.fla scripts/check_fla_export.sh [--out DIR] [--steps N] [--variants dn,...] [--reverse delta_net,...]
#                                            [--dtypes fp32,bf16]
# The parts can run in separate calls (each redoes only its own directories under --out), e.g. to stay under a time
# limit while Triton autotunes: --variants dn,pdn,gdn --reverse ''; --variants pgdn,kda,pkda --reverse '';
# --variants '' (the five reverse imports).
#
# FLA_DIR (default .fla, relative to the repository root) is an fla source tree: the directory that holds fla/
# (fla-org/flash-linear-attention; fla is pure Python + Triton, so no install is needed). python3 needs torch with
# CUDA, triton, transformers, safetensors and einops (pure Python: an einops source tree in FLA_DIR works too). Builds train_pdn, train_pdncu, train_pdncu_fp32 and the data
# tools, then runs scripts/check_fla_export.py (what it checks, and the tolerances with their derivation, are in its
# docstring): six variants exported and loaded by fla, five fla models imported, a table, exit 1 on any failure.
# Autotuning: fla's Triton kernels tune once per shape; every model here has the same small shape (B 4, T 128,
# 2 heads of 32, bf16 and fp32), so the first model pays for most of it.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/fla_env.sh "torch, transformers, safetensors, einops, triton"
make -s train_pdn train_pdncu train_pdncu_fp32 dev/data/train_bpe dev/data/prepare_shards
exec "$PYTHON" scripts/check_fla_export.py "$@"
