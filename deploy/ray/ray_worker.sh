#!/usr/bin/env bash
# Join a worker node to the rredcot Ray cluster started by deploy/ray/ray_head.sh.
#   HEAD_IP=10.0.0.1 bash deploy/ray/ray_worker.sh
# Reads: HEAD_IP, RAY_PORT (6379), RREDCOT_NODE_IP or RREDCOT_NODE_IFACE (this node's cluster address:
# deploy/ray/cluster_env.sh), NUM_GPUS and NUM_CPUS (the SLURM allocation or what the node has), RAY_START_EXTRA, NCCL_SOCKET_IFNAME,
# GLOO_SOCKET_IFNAME, RAY_AUTH_MODE (the head's, asked when unset) and the head's token (RAY_AUTH_TOKEN,
# RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token). Uses the repository's .venv when there is one.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
[ -x "$HERE/../.venv/bin/ray" ] && export PATH="$HERE/../.venv/bin:$PATH"
source "$HERE/cluster_env.sh"
HEAD_IP=${HEAD_IP:?set HEAD_IP to the head node\'s cluster-network address}
PORT=${RAY_PORT:-6379}
rredcot_node_address
rredcot_node_resources
rredcot_auth_mode ray status --address "$HEAD_IP:$PORT"
ray start --address="$HEAD_IP:$PORT" --node-ip-address="$NODE_IP" \
  $RAY_RESOURCES ${RAY_START_EXTRA:-}  # e.g. --block (SLURM)
