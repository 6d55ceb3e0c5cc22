#!/usr/bin/env bash
# Creates .venv (if missing) and installs the package with every extra.
# torch is installed *before* the package, pinned ($RELAYGEN_TORCH_PIN, default torch==2.13.0), so pip never resolves
# a multi-GB CUDA wheel on a CPU machine: without a GPU it installs the CPU build (scripts/install_torch.sh says from which index); a venv that
# already has a torch (e.g. a CUDA build a GPU user installed) keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
  .venv/bin/pip install --quiet --upgrade pip
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  bash scripts/install_torch.sh .venv
fi
# Re-install the package only when its metadata changed (a stamp keyed to pyproject.toml).
stamp=.venv/.relaygen-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[setup] installing relaygen-integrations[all] (editable)"
  .venv/bin/pip install --quiet -e ".[all]"
  echo "$want" > "$stamp"
fi
