#!/usr/bin/env bash
# Submit a training run to a running Ray cluster as a Ray job (from a laptop with a tunnel to the
# head's dashboard port, or from the head itself). The working dir is shipped to the cluster, and the
# entrypoint runs on the head inside Ray's copy of it, which is deleted with the Ray session: so the
# run directory must be an absolute path on a filesystem every node shares (RUN_DIR, or run.dir=...;
# a run.dir in the config file is not read here, and RUN_DIR overrides it). The working dir carries the
# config files; the code that runs is each node's own install of rredcot (a shared checkout and .venv,
# or one container image), never the shipped copy: the run hashes that code on every node before it
# starts and stops when a node differs, so edits reach the cluster through the nodes' install.
# `ray job stop` sends SIGTERM, then SIGKILL after RAY_JOB_STOP_WAIT_TIME_S (3 s by default): 60 s
# here, so the driver can stop the run in order and the learner write its checkpoint.
#   RUN_DIR=/shared/runs/numina bash deploy/ray/job_submit.sh qwen3-4b-numina-25k cluster.nodes=8
# Reads: RUN_DIR, RAY_JOB_ADDRESS (http://127.0.0.1:8265), RAY_AUTH_MODE (the head's, asked when unset)
# and the head's token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token).
# Uses the repository's .venv when there is one.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
[ -x "$HERE/../.venv/bin/ray" ] && export PATH="$HERE/../.venv/bin:$PATH"
source "$HERE/cluster_env.sh"
CONFIG=${1:?usage: RUN_DIR=/shared/path job_submit.sh CONFIG [key=value ...]}; shift
RUN_DIR=${RUN_DIR:-}
for arg in "$@"; do [[ $arg == run.dir=* ]] && RUN_DIR=${arg#run.dir=}; done
if [[ $RUN_DIR != /* ]]; then
  echo "job_submit.sh: set RUN_DIR (or pass run.dir=) to an absolute path on a filesystem every node shares" \
    "(got '${RUN_DIR}'): a relative one would land in Ray's per-job copy of the working dir on the head" >&2
  exit 2
fi
RAY_JOB_ADDRESS=${RAY_JOB_ADDRESS:-http://127.0.0.1:8265}
rredcot_auth_mode ray job list --address "$RAY_JOB_ADDRESS"
ray job submit --address "$RAY_JOB_ADDRESS" --working-dir . \
  --runtime-env-json '{"excludes": [".venv", "runs"], "env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": "60"}}' \
  -- rredcot train "$CONFIG" cluster.address=auto "run.dir=$RUN_DIR" "$@"
