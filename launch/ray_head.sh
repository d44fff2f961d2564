#!/usr/bin/env bash
# Start the Ray head node of an rredcot cluster.
#   HEAD_IP=10.0.0.1 bash launch/ray_head.sh
# Then on every worker node: HEAD_IP=10.0.0.1 bash launch/ray_worker.sh
# Then here: rredcot train configs/qwen2.5-1.5b-openrs.yaml cluster.address=auto cluster.nodes=4
set -euo pipefail
HEAD_IP=${HEAD_IP:?set HEAD_IP to this node\'s cluster-network address}
PORT=${RAY_PORT:-6379}
# NCCL over the cluster network (set the interface that carries HEAD_IP, e.g. ib0 or eth0)
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-$(ip -o -4 addr show | awk -v ip="$HEAD_IP" '$4 ~ "^"ip"/" {print $2}')}
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-$NCCL_SOCKET_IFNAME}
# RAY_START_EXTRA: more `ray start` flags, e.g. --block where the process must stay (SLURM steps)
ray start --head --node-ip-address="$HEAD_IP" --port="$PORT" \
  --dashboard-host=127.0.0.1 --num-gpus="${NUM_GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}" ${RAY_START_EXTRA:-}
echo "Ray head at $HEAD_IP:$PORT (dashboard on 127.0.0.1 only; tunnel with ssh -L 8265:127.0.0.1:8265)"
