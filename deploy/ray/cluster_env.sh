#!/usr/bin/env bash
# What the launch scripts share: this node's cluster-network address and Ray's authentication mode.
# Sourced by ray_head.sh, ray_worker.sh, job_submit.sh and slurm.sbatch; run, it prints NODE_IP.

# rredcot_node_address: NODE_IP, and NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME its interface, for Ray,
# NCCL and gloo alike.
#   RREDCOT_NODE_IP=10.1.0.7     an address of this node
#   RREDCOT_NODE_IFACE=ib0       or an interface: its first IPv4 address
# With neither, the first address of `hostname -I`, and the others are named on stderr: on nodes with
# management, InfiniBand and docker interfaces the first is often not the cluster network.
rredcot_node_address() {
  local all iface
  if [ -n "${RREDCOT_NODE_IP:-}" ]; then
    NODE_IP=$RREDCOT_NODE_IP
  elif [ -n "${RREDCOT_NODE_IFACE:-}" ]; then
    # `|| true`: under the scripts' set -e -o pipefail, ip's failure on a missing interface would end
    # the script here, silently (exit 1), before the line below could say why
    NODE_IP=$({ ip -o -4 addr show dev "$RREDCOT_NODE_IFACE" 2>/dev/null || true; } | awk '{split($4, a, "/"); print a[1]; exit}')
    if [ -z "$NODE_IP" ]; then
      all=$(ip -o -4 addr show | awk '!seen[$2]++ {printf "%s%s", (n++ ? ", " : ""), $2}')
      echo "rredcot: RREDCOT_NODE_IFACE=$RREDCOT_NODE_IFACE has no IPv4 address on $(hostname)" \
        "(it has: ${all:-none}):" \
        "set RREDCOT_NODE_IFACE to the cluster network's interface, or RREDCOT_NODE_IP to this node's address on it" >&2
      return 2
    fi
  else
    all=$(echo $(hostname -I))  # word-split: one space between addresses, none at the end
    NODE_IP=${all%% *}
    if [ "$(wc -w <<<"$all")" -gt 1 ]; then
      echo "rredcot: $(hostname) uses $NODE_IP, the first of its addresses ($all);" \
        "set RREDCOT_NODE_IP or RREDCOT_NODE_IFACE if the cluster network is another" >&2
    fi
  fi
  iface=$(ip -o -4 addr show | awk -v ip="$NODE_IP" '{split($4, a, "/")} a[1] == ip {print $2; exit}')
  if [ -z "$iface" ]; then
    echo "rredcot: no interface of $(hostname) holds $NODE_IP (RREDCOT_NODE_IP?)" >&2
    return 2
  fi
  export NODE_IP
  # Ray starts its workers at niceness 15: the run's workers are the node's job (docs/benchmarks.md)
  export RAY_worker_niceness=${RAY_worker_niceness:-0}
  export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-$iface}
  export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-$iface}
}

# rredcot_node_resources: NUM_GPUS and NUM_CPUS for `ray start`: as set, else this node's SLURM
# allocation (SLURM_GPUS_ON_NODE, SLURM_CPUS_ON_NODE), else nvidia-smi's GPU count and Ray's own CPU count.
rredcot_node_resources() {
  NUM_GPUS=${NUM_GPUS:-${SLURM_GPUS_ON_NODE:-$(nvidia-smi -L 2>/dev/null | wc -l)}}
  NUM_CPUS=${NUM_CPUS:-${SLURM_CPUS_ON_NODE:-}}
  RAY_RESOURCES="--num-gpus=$NUM_GPUS${NUM_CPUS:+ --num-cpus=$NUM_CPUS}"
}

# rredcot_auth_mode PROBE...: RAY_AUTH_MODE for a node or client joining a cluster, stated on stderr.
# Set, it is kept. Unset, PROBE (a ray command that asks the head, e.g. ray status --address HEAD:PORT)
# runs without a token: a head that answers runs without authentication (KubeRay's default), one that
# refuses for want of a token wants token (deploy/ray/ray_head.sh's default); a head that does not answer
# at all leaves the choice to the user (a node must match its head: one that joins with a token where
# the head has none cannot start workers).
rredcot_auth_mode() {
  local how="set" said
  if [ -z "${RAY_AUTH_MODE:-}" ]; then
    if said=$(RAY_AUTH_MODE=disabled timeout 60 "$@" 2>&1); then
      RAY_AUTH_MODE=disabled how="the head answers without a token"
    elif grep -qi "auth" <<<"$said"; then
      RAY_AUTH_MODE=token how="the head wants a token"
    else
      echo "rredcot: could not ask the head which Ray authentication it uses ($*: $(tail -n 1 <<<"$said"));" \
        "set RAY_AUTH_MODE=token or RAY_AUTH_MODE=disabled" >&2
      return 2
    fi
  fi
  export RAY_AUTH_MODE
  echo "rredcot: Ray authentication $RAY_AUTH_MODE ($how; RAY_AUTH_MODE=token or disabled to choose)" >&2
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then  # run, not sourced: print the address
  rredcot_node_address && echo "$NODE_IP"
fi
