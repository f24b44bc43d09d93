#!/usr/bin/env bash
# Several nodes, started by Open MPI's mpirun from one of them: one train_pdncu per GPU on every node.
#   HOSTS=node1,node2 GPUS_PER_NODE=8 scripts/multinode_mpirun.sh --preset pgdn-1b -i 'data/train_*.bin' -o /shared/out -y 1
# Needs: passwordless ssh between the nodes (mpirun starts the remote processes), this checkout (built) and the data
# at the same path on every node, and -o on a file system all nodes share (rank 0 writes the checkpoints; every rank
# reads them on resume). NCCL picks the fastest network it finds (InfiniBand, else TCP); set NCCL_SOCKET_IFNAME or
# NCCL_IB_HCA here if it picks the wrong one, and NCCL_DEBUG=INFO to see what it chose.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${HOSTS:?set HOSTS=node1,node2,...}"
gpn=${GPUS_PER_NODE:-8}
IFS=, read -r -a hosts <<< "$HOSTS"
hostlist=$(printf "%s:$gpn," "${hosts[@]}")
args=(-np $(( ${#hosts[@]} * gpn )) -H "${hostlist%,}" --bind-to none --map-by "ppr:$gpn:node")
[ "$(id -u)" = 0 ] && args+=(--allow-run-as-root)
for v in $(env | grep -o '^NCCL_[A-Z_]*'); do args+=(-x "$v"); done   # NCCL settings reach every rank
exec mpirun "${args[@]}" -x PATH -x LD_LIBRARY_PATH "$PWD/train_pdncu" "$@"
