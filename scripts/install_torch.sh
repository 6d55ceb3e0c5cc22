#!/usr/bin/env bash
# install_torch.sh VENV: installs the pinned torch ($RELAYGEN_TORCH_PIN, default torch==2.13.0) into the virtualenv
# VENV, the CPU build on a machine without a GPU (setup_env.sh and package_check.sh use it).
set -euo pipefail
VENV=$1
TORCH_PIN=${RELAYGEN_TORCH_PIN:-torch==2.13.0}
if command -v nvidia-smi >/dev/null 2>&1 || [[ "$TORCH_PIN" != *==* || "$TORCH_PIN" == *+* ]]; then
  # A GPU machine gets PyPI's default build (CUDA); a pin with its own build label is taken as given.
  echo "[setup] installing $TORCH_PIN from pip's configured indexes"
  "$VENV/bin/pip" install --quiet "$TORCH_PIN"
else
  # No GPU: the CPU build (torch==X+cpu). PyPI has no such wheel, so a machine on plain PyPI takes it from
  # PyTorch's CPU index; a machine whose pip configuration already offers it (a local mirror, as on our CI
  # machines) takes it from there, without the network.
  CPU_INDEX=${RELAYGEN_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
  if "$VENV/bin/pip" install --quiet --retries 0 "$TORCH_PIN+cpu" 2>/dev/null; then
    echo "[setup] installed $TORCH_PIN+cpu from pip's configured indexes"
  else
    echo "[setup] installing $TORCH_PIN+cpu from $CPU_INDEX"
    "$VENV/bin/pip" install --quiet --index-url "$CPU_INDEX" "$TORCH_PIN+cpu"
  fi
fi
