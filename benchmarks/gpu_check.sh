#!/usr/bin/env bash
# Device check (docs/gpu.md): decode cost per model eager vs static cache vs compiled (CUDA graphs), r, pass costs,
# and relay / relay-spec vs large through the engine where the demo pair is on disk. Needs only the repo and a
# Python with a CUDA build of torch plus transformers (the repo's .venv if present); fetches nothing.
#   bash benchmarks/gpu_check.sh [--steps 64] [--no-compile] [--tiny] [--tokenizer DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] && PY=.venv/bin/python
if ! "$PY" -c "import torch, transformers" 2>/dev/null; then
    echo "gpu_check: $PY cannot import torch and transformers; install them (a CUDA build of torch) first" >&2
    exit 2
fi
"$PY" -c "import torch; print('cuda available:', torch.cuda.is_available(), '| devices:', torch.cuda.device_count())"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec timeout 480 "$PY" benchmarks/gpu_check.py "$@"
