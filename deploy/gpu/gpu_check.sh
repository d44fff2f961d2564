#!/usr/bin/env bash
# On a GPU machine that has torch and transformers but no network (see deploy/gpu/gpu_wheels.sh, run
# beforehand where pip works, for the carried .whl/): install .whl/ into a private folder, run the
# GPU tests, then the LM-head benchmark, a profiled 25k-token learner step and the scorer's passes over
# a 25k-token trace (LM_HEAD_ARGS, LONG_ARGS and SCORER_ARGS replace their arguments; SKIP_BENCH=1
# skips them; BENCH_STRICT=1 fails when one fails).
# WHEELS names another kit folder.
# Logs go to $LOGS (default: $OUT, else gpu_check/). deploy/gpu/gpu_rehearsal.sh runs it on a CPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
LOGS=${LOGS:-${OUT:-gpu_check}}
mkdir -p "$LOGS"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/rredcot-site "${WHEELS:-.whl}"/*.whl || exit 1
export PYTHONPATH=/tmp/rredcot-site PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOGS/device.txt"
python3 -c "import torch, transformers, deepspeed; print('torch', torch.__version__, 'transformers', transformers.__version__, 'deepspeed', deepspeed.__version__)" | tee -a "$LOGS/device.txt"
python3 -m pytest -v -p no:xdist tests/gpu "$@" 2>&1 | tee "$LOGS/gpu_tests.log"
rc=${PIPESTATUS[0]}
if [ -z "${SKIP_BENCH:-}" ]; then
    python3 -P bench/lm_head.py ${LM_HEAD_ARGS:-} 2>&1 | tee "$LOGS/lm_head.log"
    bench_rc=${PIPESTATUS[0]}
    python3 -P bench/learner_long.py ${LONG_ARGS:---tokens 25000 --logprob-chunk 4096 --profile 25} 2>&1 \
        | tee "$LOGS/learner_long.log"
    long_rc=${PIPESTATUS[0]}
    python3 -P bench/scorer_long.py ${SCORER_ARGS:-} 2>&1 | tee "$LOGS/scorer_long.log"
    scorer_rc=${PIPESTATUS[0]}
    if [ "$bench_rc" != 0 ] || [ "$long_rc" != 0 ] || [ "$scorer_rc" != 0 ]; then
        echo "gpu_check: a benchmark failed" >&2
        if [ -n "${BENCH_STRICT:-}" ] && [ "$rc" = 0 ]; then rc=1; fi
    fi
fi
exit "$rc"
