#!/usr/bin/env bash
# Join a worker node to the rredcot Ray cluster started by launch/ray_head.sh.
#   HEAD_IP=10.0.0.1 bash launch/ray_worker.sh
# Reads: HEAD_IP, RAY_PORT (6379), NODE_IP (the first of `hostname -I`), NUM_GPUS (nvidia-smi's count),
# RAY_START_EXTRA, NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, RAY_AUTH_MODE (token) and the head's token
# (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token). Uses the repository's .venv when there is one.
set -euo pipefail
VENV_BIN="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin"
[ -x "$VENV_BIN/ray" ] && export PATH="$VENV_BIN:$PATH"
HEAD_IP=${HEAD_IP:?set HEAD_IP to the head node\'s cluster-network address}
PORT=${RAY_PORT:-6379}
NODE_IP=${NODE_IP:-$(hostname -I | awk '{print $1}')}
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-$(ip -o -4 addr show | awk -v ip="$NODE_IP" '$4 ~ "^"ip"/" {print $2}')}
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-$NCCL_SOCKET_IFNAME}
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}  # the head's (launch/ray_head.sh)
ray start --address="$HEAD_IP:$PORT" --node-ip-address="$NODE_IP" \
  --num-gpus="${NUM_GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}" ${RAY_START_EXTRA:-}  # e.g. --block (SLURM)
