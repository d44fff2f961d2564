#!/usr/bin/env bash
# Start the Ray head node of an rredcot cluster.
#   HEAD_IP=10.0.0.1 bash launch/ray_head.sh
# Then on every worker node, with this token (docs/multinode.md): HEAD_IP=10.0.0.1 bash launch/ray_worker.sh
# Then here (that config plans 2 nodes, cluster.nodes: 2; set cluster.nodes=N for another count):
#   rredcot train configs/qwen2.5-1.5b-openrs.yaml cluster.address=auto run.dir=/shared/runs/openrs
# Reads: HEAD_IP, RAY_PORT (6379), NUM_GPUS (nvidia-smi's count), RAY_START_EXTRA, NCCL_SOCKET_IFNAME,
# GLOO_SOCKET_IFNAME, RAY_AUTH_MODE (token). Uses the repository's .venv when there is one, else PATH.
set -euo pipefail
VENV_BIN="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin"
[ -x "$VENV_BIN/ray" ] && export PATH="$VENV_BIN:$PATH"
HEAD_IP=${HEAD_IP:?set HEAD_IP to this node\'s cluster-network address}
PORT=${RAY_PORT:-6379}
# NCCL over the cluster network (set the interface that carries HEAD_IP, e.g. ib0 or eth0)
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-$(ip -o -4 addr show | awk -v ip="$HEAD_IP" '$4 ~ "^"ip"/" {print $2}')}
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-$NCCL_SOCKET_IFNAME}
# Token authentication: `ray start --head` turns it on only when a token exists, so make one if none
# (~/.ray/auth_token, unless RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH gives it) and require it.
# Every worker node, driver and job submitter then needs RAY_AUTH_MODE=token and the same token.
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
[ "$RAY_AUTH_MODE" = token ] && ray get-auth-token --generate >/dev/null
# RAY_START_EXTRA: more `ray start` flags, e.g. --block where the process must stay (SLURM steps)
ray start --head --node-ip-address="$HEAD_IP" --port="$PORT" \
  --dashboard-host=127.0.0.1 --num-gpus="${NUM_GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}" ${RAY_START_EXTRA:-}
echo "Ray head at $HEAD_IP:$PORT (dashboard on 127.0.0.1 only; tunnel with ssh -L 8265:127.0.0.1:8265)"
[ "$RAY_AUTH_MODE" = token ] && echo "Token authentication on: give other nodes the token (ray get-auth-token)"
exit 0
