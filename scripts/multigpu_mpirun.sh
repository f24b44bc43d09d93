#!/usr/bin/env bash
# One node, several GPUs, started by Open MPI's mpirun: one train_pdncu per GPU; MPI hands NCCL's id around.
#   scripts/multigpu_mpirun.sh --preset pgdn-340m -i 'data/fineweb_train_*.bin' -j 'data/fineweb_val_*.bin' -o out
# NGPU=4 uses the first 4 GPUs (default: all). -b is per GPU; -d (tokens per optimizer step) is the total over all
# GPUs, so the same -d trains the same model on any number of GPUs (accumulation steps = -d / (-b x -t x GPUs)).
# Resume with -y 1 on any number of GPUs as long as -b, -t and -d stay the same.
set -euo pipefail
cd "$(dirname "$0")/.."
ngpu=${NGPU:-$(nvidia-smi -L | wc -l)}
make -s train_pdncu
args=(-np "$ngpu" --bind-to none)
[ "$(id -u)" = 0 ] && args+=(--allow-run-as-root)
exec mpirun "${args[@]}" ./train_pdncu "$@"
