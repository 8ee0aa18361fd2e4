#!/usr/bin/env python3
"""gpt-oss's tool calls and response formats through OpenAI's official `openai` client.

The model (tests/fixtures/models/gpt_oss_chat) has random weights: each request holds its
output with a grammar (a call the request requires, or a response format) and keeps the
thinking channel out with a logit bias on its token, so that what comes back is known. A
call by name and a required call, whole and streamed; an answer in a JSON schema; a second
turn after a call, its thinking sent back.

Run by tests/tests/harmony.rs, or by hand against a gateway serving the fixture:

    python3 tests/clients/harmony_client.py --base-url http://127.0.0.1:8000 --model gpt-oss \
        --analysis-token 255

Prints one JSON object with what came back (the Rust test judges it).
"""

import argparse
import json

from openai import OpenAI

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris"]}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a zone.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC"]}},
                   "required": ["zone"], "additionalProperties": False}}}
ANSWER = {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": {
    "type": "object", "properties": {"answer": {"type": "string", "enum": ["Paris"]}},
    "required": ["answer"], "additionalProperties": False}}}


def extra(obj, name):
    return (obj.model_extra or {}).get(name)


def calls_of(message):
    return [{"id": c.id, "name": c.function.name, "arguments": json.loads(c.function.arguments)}
            for c in message.tool_calls or []]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--analysis-token", type=int, required=True)
    a = p.parse_args()
    client = OpenAI(base_url=a.base_url + "/v1", api_key="none")
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    # Room for the JSON's whitespace a random model may write (16 characters at most between
    # tokens, one token each in this vocabulary) besides a call's 43-token header.
    held = dict(model=a.model, temperature=0, max_tokens=256,
                logit_bias={str(a.analysis_token): -100})
    out = {}

    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(**held, messages=question, tools=[WEATHER, TIME],
                                       tool_choice=named)
    m = r.choices[0].message
    out["named"] = {"calls": calls_of(m), "content": m.content,
                    "finish_reason": r.choices[0].finish_reason}

    pieces, names, ids, finish = {}, {}, {}, None
    for chunk in client.chat.completions.create(**held, messages=question, tools=[WEATHER, TIME],
                                                tool_choice="required", stream=True):
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        finish = c.finish_reason or finish
        for d in c.delta.tool_calls or []:
            pieces[d.index] = pieces.get(d.index, "") + (d.function.arguments or "")
            if d.function.name:
                names[d.index], ids[d.index] = d.function.name, d.id
    out["required_streamed"] = {
        "calls": [{"name": names[i], "arguments": json.loads(pieces[i])} for i in sorted(pieces)],
        "finish_reason": finish}

    r = client.chat.completions.create(**held, messages=question, response_format=ANSWER)
    m = r.choices[0].message
    out["schema"] = {"content": json.loads(m.content),
                     "reasoning_content": extra(m, "reasoning_content"),
                     "finish_reason": r.choices[0].finish_reason}

    call = out["named"]["calls"][0]
    history = question + [
        {"role": "assistant", "content": None, "reasoning_content": "Need the weather.",
         "tool_calls": [{"id": call["id"], "type": "function",
                         "function": {"name": call["name"],
                                      "arguments": json.dumps(call["arguments"])}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": "18 C and sunny"}]
    r = client.chat.completions.create(**held, messages=history, tools=[WEATHER, TIME],
                                       tool_choice="none", response_format=ANSWER)
    out["second_turn"] = {"content": json.loads(r.choices[0].message.content),
                          "prompt_tokens": r.usage.prompt_tokens}

    print(json.dumps(out))


if __name__ == "__main__":
    main()
