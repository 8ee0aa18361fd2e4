#!/usr/bin/env bash
# The first structured request after start against later ones (issue 25's check "no slower than
# later ones by more than its compile"), with a plain request's first-after-start as the baseline
# for what any first request pays. For each round and kind: a fresh `ferrite serve` of the default
# model, five identical requests one after another; prints each one's seconds (and its completion
# tokens). Usage, from the repository root after `cargo build --release`:
#   bash tests/clients/first_request.sh [ROUNDS]
set -euo pipefail
rounds=${1:-3}
port=8321
req='{"model":"smollm2-135m","temperature":0,"max_tokens":40,"messages":[{"role":"user","content":"Describe Paris as JSON."}],"response_format":{"type":"json_schema","json_schema":{"name":"city","strict":true,"schema":{"type":"object","additionalProperties":false,"required":["name","country","population"],"properties":{"name":{"type":"string"},"country":{"type":"string"},"population":{"type":"integer"}}}}}}'
plain='{"model":"smollm2-135m","temperature":0,"max_tokens":40,"messages":[{"role":"user","content":"Describe Paris as JSON."}]}'
for round in $(seq "$rounds"); do
  for kind in structured plain; do
    (target/release/ferrite serve --model smollm2-135m --grpc-listen 127.0.0.1:0 --http-listen 127.0.0.1:$port > /tmp/serve_first.log 2>&1 &)
    for i in $(seq 60); do curl -sf localhost:$port/v1/models >/dev/null && break; sleep 0.5; done
    body=$([ $kind = structured ] && echo "$req" || echo "$plain")
    line="$kind round$round:"
    for n in 1 2 3 4 5; do
      t=$(curl -s -o /tmp/first_out.json -w '%{time_total}' localhost:$port/v1/chat/completions -H 'content-type: application/json' -d "$body")
      toks=$(python3 -c "import json; print(json.load(open('/tmp/first_out.json'))['usage']['completion_tokens'])")
      line="$line $t($toks)"
    done
    echo "$line"
    pkill -f "ferrite serve --model smollm2-135m --grpc-listen 127.0.0.1:0 --http-listen 127.0.0.1:$port" || true; sleep 1
  done
done
