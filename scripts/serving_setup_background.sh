#!/usr/bin/env bash
# `make test` builds the serving engines' virtualenvs (scripts/serving_engines.sh setup: vLLM's wheel, then
# llama-cpp-python compiled from source, ~9 min of both cores on a 2-core CPU) while the main suite runs, at the
# lowest CPU priority: the build takes the cycles the suite leaves idle (single-threaded Python between passes, model
# loading, waiting on files) instead of a phase of its own, and the suite keeps the cores whenever it wants them.
#
#   scripts/serving_setup_background.sh start   start the build (vllm, then llamacpp) detached; returns at once
#   scripts/serving_setup_background.sh wait    wait for it; exit 1 with its log when it failed
#   scripts/serving_setup_background.sh stop    stop it (all its processes) if it still runs
#
# Its log, pid and exit status live under $RELAYGEN_SERVING_DIR/run (default ~/.cache/relaygen/serving/run).
set -euo pipefail
cd "$(dirname "$0")/.."

HOME_DIR=${RELAYGEN_HOME:-$HOME/.cache/relaygen}
RUN=${RELAYGEN_SERVING_DIR:-$HOME_DIR/serving}/run
LOG=$RUN/setup.log
PID=$RUN/setup.pid
STATUS=$RUN/setup.status
mkdir -p "$RUN"

running() {
  [ -f "$PID" ] && kill -0 "$(cat "$PID")" 2> /dev/null
}

case "${1:-}" in
  start)
    if running; then
      echo "[serving] a setup already runs (pid $(cat "$PID"))" >&2
      exit 0
    fi
    rm -f "$STATUS"
    # setsid: a process group of its own, so `stop` reaches pip and the compilers too; nice 19: idle cycles only.
    setsid nice -n 19 bash -c '
      status=0
      { bash scripts/serving_engines.sh setup vllm && bash scripts/serving_engines.sh setup llamacpp; } || status=$?
      echo "$status" > "$0"
    ' "$STATUS" > "$LOG" 2>&1 < /dev/null &
    echo $! > "$PID"
    echo "[serving] building the serving engines in the background (log: $LOG)" >&2
    ;;
  wait)
    if [ ! -f "$PID" ]; then
      echo "[serving] no background setup was started: run '$0 start' first" >&2
      exit 1
    fi
    started=$SECONDS
    while running; do
      sleep 2
    done
    cat "$LOG" >&2
    status=$(cat "$STATUS" 2> /dev/null || echo "missing")
    rm -f "$PID"
    if [ "$status" != 0 ]; then
      echo "[serving] the background setup failed (status $status): see the log above" >&2
      exit 1
    fi
    echo "[serving] background setup done; waited $((SECONDS - started)) s for it after the main suite" >&2
    ;;
  stop)
    if running; then
      kill -TERM -- "-$(cat "$PID")" 2> /dev/null || true
    fi
    rm -f "$PID"
    ;;
  *)
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
