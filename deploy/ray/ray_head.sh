#!/usr/bin/env bash
# Start the Ray head node of an rredcot cluster.
#   bash deploy/ray/ray_head.sh                       # or RREDCOT_NODE_IFACE=ib0 bash deploy/ray/ray_head.sh
# Then on every worker node, with this token (docs/multinode.md): HEAD_IP=10.0.0.1 bash deploy/ray/ray_worker.sh
# Then here (that config plans 2 nodes, cluster.nodes: 2; set cluster.nodes=N for another count):
#   rredcot train qwen2.5-1.5b-openrs cluster.address=auto run.dir=/shared/runs/openrs
# Reads: RREDCOT_NODE_IP or RREDCOT_NODE_IFACE (this node's cluster address: deploy/ray/cluster_env.sh),
# RAY_PORT (6379), NUM_GPUS and NUM_CPUS (the SLURM allocation or what the node has), RAY_START_EXTRA, NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME,
# RAY_AUTH_MODE (token). Uses the repository's .venv when there is one, else PATH.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
[ -x "$HERE/../.venv/bin/ray" ] && export PATH="$HERE/../.venv/bin:$PATH"
source "$HERE/cluster_env.sh"
rredcot_node_resources
rredcot_node_address  # NODE_IP; NCCL and gloo on its interface (set NCCL_SOCKET_IFNAME for InfiniBand, e.g. ib0)
PORT=${RAY_PORT:-6379}
# Token authentication: `ray start --head` turns it on only when a token exists, so make one if none
# (~/.ray/auth_token, unless RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH gives it) and require it.
# Every worker node, driver and job submitter then needs RAY_AUTH_MODE=token and the same token.
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
[ "$RAY_AUTH_MODE" = token ] && ray get-auth-token --generate >/dev/null
# RAY_START_EXTRA: more `ray start` flags, e.g. --block where the process must stay (SLURM steps)
ray start --head --node-ip-address="$NODE_IP" --port="$PORT" \
  --dashboard-host=127.0.0.1 $RAY_RESOURCES ${RAY_START_EXTRA:-}
echo "Ray head at $NODE_IP:$PORT (dashboard on 127.0.0.1 only; tunnel with ssh -L 8265:127.0.0.1:8265)"
[ "$RAY_AUTH_MODE" = token ] && echo "Token authentication on: give other nodes the token (ray get-auth-token)"
exit 0
