#!/usr/bin/env bash
# Rehearse deploy/gpu/gpu_check.sh on a CPU machine before spending device time on it. A fresh venv holds
# only what the GPU image holds (torch, transformers at the image's version, the packages DeepSpeed
# imports that the image has); the kit of deploy/gpu/gpu_wheels.sh, built for this Python, goes in the
# way gpu_check.sh puts it in. Then gpu_check.sh itself (tests/gpu skip on a CPU, so this checks
# their imports; both benchmarks at smoke size), the rendezvous test's rank on gloo, and the CPU
# tests of the code tests/gpu runs. Needs .venv (deploy/setup.sh), pip access to this .venv's torch
# build and an x86-64 host (the kit's binary wheels are x86-64). REHEARSAL_DIR: where it works.
set -euo pipefail
cd "$(dirname "$0")/../.."
IMAGE_TRANSFORMERS=${IMAGE_TRANSFORMERS:-5.17.0}  # the GPU image's (docs/benchmarks.md, issue 17)
DIR=${REHEARSAL_DIR:-/tmp/rredcot-gpu-rehearsal}
torch=$(.venv/bin/python -c "import torch; print(torch.__version__)")
pyver=$(.venv/bin/python -c "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')")
if [ -e "$DIR" ] && [ ! -e "$DIR/wheels.log" ]; then echo "refusing to replace $DIR: not a rehearsal's folder" >&2; exit 1; fi
rm -rf "$DIR" /tmp/rredcot-site && mkdir -p "$DIR" && touch "$DIR/wheels.log"
"$(.venv/bin/python -c "import sys; print(sys._base_executable)")" -m venv "$DIR/venv"
"$DIR/venv/bin/pip" install -q "torch==$torch" "transformers==$IMAGE_TRANSFORMERS" einops ninja numpy packaging \
    psutil py-cpuinfo tqdm pyyaml pytest pytest-timeout hypothesis mpmath 2>&1 | { grep -v "^WARNING: Location" || true; }
WHEELS="$DIR/whl" PYVER=$pyver bash deploy/gpu/gpu_wheels.sh > "$DIR/wheels.log"
export PATH="$DIR/venv/bin:$PATH"
echo "rehearsal: torch $torch, transformers $IMAGE_TRANSFORMERS, Python $pyver, kit $(du -sh "$DIR/whl" | cut -f1)"
WHEELS="$DIR/whl" LOGS="$DIR/logs" LM_HEAD_ARGS="--tokens 512 --vocab 32000 --chunk 128 --steps 1" \
    LONG_ARGS="--preset smoke --tokens 4000 --logprob-chunk 1024 --profile 5" \
    SCORER_ARGS="--preset smoke --tokens 2000 --exits 8 --tail-tokens 60 --memory-mb 64" BENCH_STRICT=1 bash deploy/gpu/gpu_check.sh -q
export PYTHONPATH=/tmp/rredcot-site
python3 -m pytest --collect-only -q -p no:xdist tests/gpu | tail -1
python3 -m tests.gpu.rendezvous_rank 2>&1 | tail -1
python3 -m pytest -q -p no:xdist tests/unit/learner tests/unit/redistributor/test_values.py \
    tests/unit/redistributor/test_branch_attention.py tests/unit/transports/test_slots.py \
    tests/unit/transports/test_group.py tests/unit/transports/test_file.py tests/unit/transports/test_collective.py \
    tests/unit/transports/test_ipc.py
echo "rehearsal: passed (logs in $DIR/logs)"
