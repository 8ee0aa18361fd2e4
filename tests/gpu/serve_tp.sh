#!/usr/bin/env bash
# `ferrite serve --tp 3` on one GPU (three rank processes sharing it over the host), over the
# OpenAI API: its greedy answer beside one rank's, then a rank killed with SIGKILL while a
# stream runs, and how long the client's stream takes to end. Usage: serve_tp.sh FERRITE_BIN
set -uo pipefail
f="${1:?the ferrite binary}"
device="${SMOKE_DEVICE:-cuda}" # cpu: to try this script where there is no GPU
ask='{"model": "smollm2-135m", "temperature": 0, "max_tokens": 32,
      "messages": [{"role": "user", "content": "What is the capital of France?"}]}'
long='{"model": "smollm2-135m", "temperature": 0, "max_tokens": 3000, "stream": true,
       "stream_options": {"include_usage": true}, "ignore_eos": true,
       "messages": [{"role": "user", "content": "Tell me a very long story."}]}'

start() { # label, serve flags...: starts serve, waits for "ready" (≤ 120 s)
  local label=$1
  shift
  "$f" serve --device "$device" --dtype float16 --http-listen 127.0.0.1:8000 \
    --listen 127.0.0.1:50051 "$@" >"/tmp/serve-$label.out" 2>"/tmp/serve-$label.err" &
  pid=$!
  for _ in $(seq 120); do
    grep -q '^ready' "/tmp/serve-$label.out" && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  echo "$label: not ready"
  tail -20 "/tmp/serve-$label.err"
  return 1
}

stop() {
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}

answer() {
  curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' -d "$ask" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])'
}

if start tp1; then
  echo "tp 1: $(answer)"
  stop
fi
if start tp3 --tp 3; then
  echo "tp 3 (host, 3 ranks on one GPU): $(answer)"
  ps -eo pid,args | grep '[w]orker --pool' | head -3
  curl -sN localhost:8000/v1/chat/completions -H 'content-type: application/json' \
    -d "$long" >/tmp/stream.txt 2>&1 &
  client=$!
  sleep 4
  victim=$(ps -eo pid,args | grep '[w]orker --pool' | grep -- '--rank 2' | awk '{print $1}' | head -1)
  echo "killing rank 2 (pid $victim) after 4 s of streaming"
  t0=$(date +%s.%N)
  kill -9 "$victim"
  wait "$client"
  t1=$(date +%s.%N)
  echo "the client's stream ended $(python3 -c "print(f'{$t1 - $t0:.2f}')") s after the kill"
  echo "chunks received: $(grep -c '^data:' /tmp/stream.txt); last lines:"
  tail -c 600 /tmp/stream.txt
  echo
  tail -5 /tmp/serve-tp3.err
  stop
fi
