#!/usr/bin/env bash
# Submit a training run to a running Ray cluster as a Ray job (from a laptop with a tunnel to the
# head's dashboard port, or from the head itself). The working dir is shipped to the cluster.
# `ray job stop` sends SIGTERM, then SIGKILL after RAY_JOB_STOP_WAIT_TIME_S (3 s by default): 60 s
# here, so the driver can stop the run in order and the learner write its checkpoint.
#   bash launch/job_submit.sh configs/qwen3-4b-numina-25k.yaml cluster.nodes=8
set -euo pipefail
CONFIG=${1:?usage: job_submit.sh CONFIG [key=value ...]}; shift
ray job submit --address "${RAY_JOB_ADDRESS:-http://127.0.0.1:8265}" --working-dir . \
  --runtime-env-json '{"excludes": [".venv", "runs"], "env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": "60"}}' \
  -- rredcot train "$CONFIG" cluster.address=auto "$@"
