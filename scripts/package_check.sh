#!/usr/bin/env bash
# The package as a user installs it, away from the checkout (`make package-check`, run by `make test`):
#   1. newest: `pip wheel .` installed with the langchain and llama-index extras into a fresh virtualenv; from a
#      directory outside the repository, scripts/package_smoke.py imports both adapters, finds the wheel's data and
#      runs `relaygen demo --help` and a one-problem `relaygen bench` on the tests' tiny random-weight pair.
#   2. floors: the same wheel into another fresh virtualenv with every declared dependency at its floor
#      (scripts/floors.py: name>=X becomes name==X), then the adapters' imports.
# torch comes first, from scripts/install_torch.sh (as in setup_env.sh); the other packages from pip's configured
# indexes. Work files go to a temporary directory, removed at the end. ~5 min on a 2-core machine with a local index.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/relaygen-package-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
EXTRAS=(langchain llama-index)

started=$SECONDS
"$ROOT/.venv/bin/pip" wheel --quiet --no-deps --wheel-dir "$WORK/dist" "$ROOT"
WHEEL=$(ls "$WORK"/dist/relaygen_integrations-*.whl)
"$ROOT/.venv/bin/python" "$ROOT/scripts/floors.py" "${EXTRAS[@]}" > "$WORK/floors.txt"
# The tests' tiny random-weight pair (tests/helpers.py, the tokenizer fixture), saved as a user's checkpoints are.
PYTHONPATH="$ROOT/tests" "$ROOT/.venv/bin/python" - "$WORK/pair" <<'EOF'
import sys
from pathlib import Path

from fixture_tokenizer import fixture_tokenizer_dir
from helpers import tiny_qwen2
from transformers import AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(fixture_tokenizer_dir())
for role, seed in (("large", 1), ("small", 2)):
    tiny_qwen2(tokenizer, seed).save_pretrained(Path(sys.argv[1]) / role)
    tokenizer.save_pretrained(Path(sys.argv[1]) / role)
EOF

install() {  # install VENV [pip args...]: a fresh virtualenv with the pinned torch and the wheel
  local venv=$1
  shift
  "$PY" -m venv "$venv"
  bash "$ROOT/scripts/install_torch.sh" "$venv"
  "$venv/bin/pip" install --quiet "$@" "$WHEEL[$(IFS=,; echo "${EXTRAS[*]}")]"
}

echo "[package] newest dependencies: $(basename "$WHEEL")"
install "$WORK/newest"
(cd "$WORK" && "$WORK/newest/bin/python" "$ROOT/scripts/package_smoke.py" --pair "$WORK/pair")

echo "[package] dependency floors: $(tr '\n' ' ' < "$WORK/floors.txt")"
install "$WORK/floors" --constraint "$WORK/floors.txt"
(cd "$WORK" && "$WORK/floors/bin/python" "$ROOT/scripts/package_smoke.py" --imports-only)
echo "[package] ok in $((SECONDS - started)) s"
