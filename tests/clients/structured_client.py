#!/usr/bin/env python3
"""Structured outputs, tool calls and log-probabilities through the official `openai` client.

Run by tests/tests/structured.rs, or by hand against a running gateway:

    python3 tests/clients/structured_client.py --base-url http://127.0.0.1:8000/v1 --model smollm2-135m

Calls `chat.completions.parse` with a Pydantic model, a choice list (vLLM's `structured_outputs`)
with chat logprobs, a regex on the legacy completions endpoint with its logprobs, a streamed
JSON schema, a Lark grammar, tool calls (auto, required, named, streamed, a round trip), a
logit bias, and every kind of bad constraint or bias; prints one JSON object with what
came back (the Rust test judges it). Greedy throughout (temperature 0).
"""

import argparse
import json
import re
from urllib.parse import urlparse

import jsonschema
import openai
from pydantic import BaseModel


class City(BaseModel):
    name: str
    country: str
    population: int


def parsed(client, model):
    r = client.chat.completions.parse(
        model=model, temperature=0, max_tokens=120, response_format=City,
        messages=[{"role": "user", "content": "Describe Paris as JSON."}])
    c = r.choices[0]
    return {"parsed": c.message.parsed.model_dump() if c.message.parsed else None,
            "finish": c.finish_reason}


def choice(client, model):
    choices = ["yes", "no", "maybe not"]
    r = client.chat.completions.create(
        model=model, temperature=0, max_tokens=10, logprobs=True, top_logprobs=3,
        messages=[{"role": "user", "content": "Is Paris in France? Answer yes or no."}],
        extra_body={"structured_outputs": {"choice": choices}})
    c = r.choices[0]
    content = c.logprobs.content
    return {"content": c.message.content, "in_choices": c.message.content in choices,
            "finish": c.finish_reason,
            "logprob_tokens": "".join(t.token for t in content),
            "bytes_match": all(bytes(t.bytes).decode() == t.token for t in content),
            "top_counts": [len(t.top_logprobs) for t in content],
            "logprobs": [t.logprob for t in content]}


def regex(client, model):
    pattern = r" [0-9]{4}\."
    r = client.completions.create(
        model=model, prompt="The Eiffel Tower was finished in the year", temperature=0,
        max_tokens=12, logprobs=2, extra_body={"structured_outputs": {"regex": pattern}})
    c = r.choices[0]
    return {"text": c.text, "matches": re.fullmatch(pattern, c.text) is not None,
            "finish": c.finish_reason, "tokens": "".join(c.logprobs.tokens),
            "offsets": c.logprobs.text_offset, "top": [len(t) for t in c.logprobs.top_logprobs]}


def streamed_schema(client, model):
    schema = {"type": "object", "additionalProperties": False, "required": ["name", "tags"],
              "properties": {"name": {"type": "string", "maxLength": 20},
                             "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
                                      "minItems": 1, "maxItems": 3}}}
    text, finish = "", None
    stream = client.chat.completions.create(
        model=model, temperature=0, max_tokens=80, stream=True,
        messages=[{"role": "user", "content": "A JSON object with a name and tags."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "t", "schema": schema, "strict": True}})
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    try:
        jsonschema.validate(json.loads(text), schema)
        valid = True
    except Exception as e:  # noqa: BLE001 - the reason is the result
        valid = str(e)[:200]
    return {"text": text, "valid": valid, "finish": finish}


def lark(client, model):
    r = client.chat.completions.create(
        model=model, temperature=0, max_tokens=10,
        messages=[{"role": "user", "content": "Name a capital city."}],
        extra_body={"structured_outputs": {"grammar": 'start: "Paris" | "Rome" | "Tokyo"'}})
    return {"content": r.choices[0].message.content, "finish": r.choices[0].finish_reason}


TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"The {what} in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
    for name, what in (("get_weather", "weather"), ("get_time", "local time"))]


def calls_of(message):
    """A message's tool calls as plain data, each with whether its arguments are JSON."""
    out = []
    for c in message.tool_calls or []:
        try:
            args = json.loads(c.function.arguments)
        except ValueError:
            args = None
        out.append({"id": c.id, "type": c.type, "name": c.function.name, "arguments": args})
    return out


def streamed_calls(client, model, messages, choice):
    """The calls of a streamed answer, put together from their chunks: each call's id, type
    and name must come first, then pieces of its arguments (counted: they come as the model
    writes them, not whole at the end)."""
    calls, order, finish, pieces = {}, [], None, {}
    for chunk in client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, tool_choice=choice, temperature=0,
            max_tokens=80, stream=True):
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        for d in chunk.choices[0].delta.tool_calls or []:
            if d.index not in calls:
                calls[d.index] = {"id": d.id, "type": d.type, "name": d.function.name, "arguments": ""}
                order.append("head" if d.id and d.function.name else "no head")
            if d.function.arguments:
                calls[d.index]["arguments"] += d.function.arguments
                pieces[d.index] = pieces.get(d.index, 0) + 1
    for c in calls.values():
        c["arguments"] = json.loads(c["arguments"])
    return {"calls": list(calls.values()), "order": order, "finish": finish,
            "argument_pieces": [pieces.get(i, 0) for i in sorted(calls)]}


def tools(client, model):
    """auto, required and a named function, streamed and not, then a round trip: the call,
    the tool's answer as a `tool` message, and the final answer (tool_choice none)."""
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    out = {}
    named = {"type": "function", "function": {"name": "get_weather"}}
    for key, choice in (("auto", "auto"), ("required", "required"), ("named", named)):
        r = client.chat.completions.create(model=model, messages=ask, tools=TOOLS,
                                           tool_choice=choice, temperature=0, max_tokens=80)
        c = r.choices[0]
        out[key] = {"finish": c.finish_reason, "content": c.message.content,
                    "calls": calls_of(c.message)}
    out["streamed"] = streamed_calls(client, model, ask, "required")
    call = client.chat.completions.create(model=model, messages=ask, tools=TOOLS,
                                          tool_choice=named, temperature=0,
                                          max_tokens=80).choices[0].message
    history = ask + [
        {"role": "assistant", "content": None,
         "tool_calls": [c.model_dump() for c in call.tool_calls]},
        {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "Sunny, 24 C"}]
    final = client.chat.completions.create(model=model, messages=history, tools=TOOLS,
                                           tool_choice="none", temperature=0, max_tokens=40)
    out["final"] = {"finish": final.choices[0].finish_reason,
                    "content": final.choices[0].message.content,
                    "calls": calls_of(final.choices[0].message)}
    return out


def logit_bias(client, model):
    """A bias of +100 on token 28 (","): every token is that one, and each logprob is the
    model's own, before the bias."""
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello."}], temperature=0,
        max_tokens=6, logprobs=True, top_logprobs=1, logit_bias={"28": 100})
    c = r.choices[0]
    content = c.logprobs.content
    return {"content": c.message.content, "finish": c.finish_reason,
            "tokens": [t.token for t in content], "logprobs": [t.logprob for t in content],
            "top": [t.top_logprobs[0].token for t in content]}


def refusals(client, model):
    """Status and message of each bad constraint, then a plain request (served on)."""
    user = [{"role": "user", "content": "hi"}]
    cases = {
        "schema_not_compiled": {"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "strict": True, "schema": {"type": "strnig"}}}},
        "schema_not_json": {"extra_body": {"structured_outputs": {"json": "{not json"}}},
        "schema_not_object": {"response_format": {"type": "json_schema",
                                                  "json_schema": {"name": "x", "schema": [1]}}},
        "regex": {"extra_body": {"structured_outputs": {"regex": "(unclosed"}}},
        "lark": {"extra_body": {"structured_outputs": {"grammar": "start: nowhere"}}},
        "too_big": {"extra_body": {"structured_outputs": {"regex": "a" * 200_000}}},
        "empty_choice": {"extra_body": {"structured_outputs": {"choice": []}}},
        "two_constraints": {"response_format": {"type": "json_object"},
                            "extra_body": {"structured_outputs": {"regex": "a"}}},
        "wizard_role": {"messages": [{"role": "wizard", "content": "hi"}]},
        "tool_message": {"messages": [{"role": "tool", "content": "42"}]},
        "top_logprobs_alone": {"top_logprobs": 2},
        "missing_function": {"tools": TOOLS,
                             "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "bad_tool_name": {"tools": [{"type": "function", "function": {"name": "a b"}}]},
        "logit_bias_key": {"logit_bias": {"the": 1}},
        "logit_bias_range": {"logit_bias": {"28": 101}},
        "logit_bias_vocabulary": {"logit_bias": {"999999": 5}},
    }
    out = {}
    for name, extra in cases.items():
        kw = {"model": model, "messages": user, "max_tokens": 2, **extra}
        try:
            client.chat.completions.create(**kw)
            out[name] = {"status": 200}
        except openai.APIStatusError as e:
            body = e.body if isinstance(e.body, dict) else {}
            out[name] = {"status": e.status_code, "message": body.get("message", str(e))[:300],
                         "param": body.get("param")}
    r = client.chat.completions.create(model=model, messages=user, max_tokens=2)
    out["served_on"] = r.choices[0].finish_reason is not None
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    host = urlparse(args.base_url).hostname
    assert host in ("127.0.0.1", "localhost"), "a local gateway only"
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", max_retries=0, timeout=120)
    out = {"parsed": parsed(client, args.model), "choice": choice(client, args.model),
           "regex": regex(client, args.model), "stream": streamed_schema(client, args.model),
           "lark": lark(client, args.model), "tools": tools(client, args.model),
           "logit_bias": logit_bias(client, args.model),
           "refused": refusals(client, args.model)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
