#!/usr/bin/env python3
"""The Responses API (`POST /v1/responses`) through the official `openai` client.

Run by tests/tests/structured.rs, or by hand against a running gateway:

    python3 tests/clients/responses_client.py --base-url http://127.0.0.1:8000/v1 --model smollm2-135m

Asks `responses.create` for text (set beside the chat endpoint's answer to the same messages),
with instructions and a developer message, cut short by `max_output_tokens`, streamed, with
logprobs; `responses.parse` with a Pydantic model; function calls (required, streamed, and a
round trip with their outputs); a response continued by `previous_response_id`, retrieved and
deleted; and what is not served. Prints one JSON object with what came
back (the Rust test judges it). Greedy throughout (temperature 0).
"""

import argparse
import json
from urllib.parse import urlparse

import openai
from pydantic import BaseModel


class City(BaseModel):
    name: str
    country: str
    population: int


TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
          "parameters": {"type": "object", "required": ["city"],
                         "properties": {"city": {"type": "string"}}}}]


def chat_text(client, model, messages, max_tokens):
    r = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                       max_tokens=max_tokens)
    return r.choices[0].message.content


def texts(client, model):
    question = "What is the capital of France?"
    r = client.responses.create(model=model, input=question, temperature=0, max_output_tokens=24)
    brief = [{"role": "developer", "content": "Answer in one sentence."},
             {"role": "user", "content": question}]
    r2 = client.responses.create(model=model, instructions="You are a geography teacher.",
                                 input=brief, temperature=0, max_output_tokens=24)
    chat2 = [{"role": "system", "content": "You are a geography teacher."},
             {"role": "system", "content": "Answer in one sentence."},
             {"role": "user", "content": question}]
    cut = client.responses.create(model=model, input=question, temperature=0, max_output_tokens=3)
    return {"text": r.output_text, "status": r.status, "id": r.id,
            "usage": r.usage.model_dump(), "chat": chat_text(client, model,
                                                             [{"role": "user", "content": question}], 24),
            "instructed": r2.output_text, "instructed_chat": chat_text(client, model, chat2, 24),
            "cut": {"status": cut.status, "reason": cut.incomplete_details.reason
                    if cut.incomplete_details else None,
                    "output_tokens": cut.usage.output_tokens}}


def streamed(client, model):
    events = list(client.responses.create(model=model, input="Name three colors.", temperature=0,
                                          max_output_tokens=24, stream=True))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    final = events[-1].response
    return {"types": [e.type for e in events],
            "sequence": [e.sequence_number for e in events],
            "deltas": len(deltas), "joined": "".join(deltas), "final_text": final.output_text,
            "final_status": final.status}


def logprobs(client, model):
    r = client.responses.create(model=model, input="Is Paris in France?", temperature=0,
                                max_output_tokens=8, top_logprobs=2,
                                include=["message.output_text.logprobs"])
    part = r.output[0].content[0]
    return {"text": part.text, "tokens": "".join(t.token for t in part.logprobs),
            "top_counts": [len(t.top_logprobs) for t in part.logprobs],
            "all_negative": all(t.logprob <= 0 for t in part.logprobs)}


def parsed(client, model):
    r = client.responses.parse(model=model, input="Describe Paris as JSON.", text_format=City,
                               temperature=0, max_output_tokens=120)
    return {"parsed": r.output_parsed.model_dump() if r.output_parsed else None,
            "status": r.status}


def calls(client, model):
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.responses.create(model=model, input=question, tools=TOOLS, tool_choice="required",
                                temperature=0, max_output_tokens=100)
    made = [o for o in r.output if o.type == "function_call"]
    outputs = [{"type": "function_call_output", "call_id": c.call_id,
                "output": "22 degrees and sunny"} for c in made]
    history = question + [c.model_dump() for c in made] + outputs
    answer = client.responses.create(model=model, input=history, tools=TOOLS, tool_choice="none",
                                     temperature=0, max_output_tokens=40)
    events = list(client.responses.create(model=model, input=question, tools=TOOLS,
                                          tool_choice="required", temperature=0,
                                          max_output_tokens=100, stream=True))
    final = events[-1].response
    first = next((i for i, o in enumerate(final.output) if o.type == "function_call"), None)
    first_call = final.output[first] if first is not None else None
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"
              and e.output_index == first]
    return {"calls": [{"name": c.name, "call_id": c.call_id, "arguments": json.loads(c.arguments)}
                      for c in made],
            "answer": answer.output_text, "answer_types": [o.type for o in answer.output],
            "stream_types": [e.type for e in events], "argument_pieces": len(pieces),
            "joined": "".join(pieces),
            "final_arguments": first_call.arguments if first_call else None}


def kept(client, model):
    """A response continued by previous_response_id gives the chat endpoint's answer to the
    whole conversation; kept responses are retrieved and deleted; store=False keeps none."""
    first = "My name is Ada. Say hello to me."
    r1 = client.responses.create(model=model, input=first, temperature=0, max_output_tokens=24)
    r2 = client.responses.create(model=model, previous_response_id=r1.id,
                                 input="What is my name?", temperature=0, max_output_tokens=24)
    chat = chat_text(client, model, [{"role": "user", "content": first},
                                     {"role": "assistant", "content": r1.output_text},
                                     {"role": "user", "content": "What is my name?"}], 24)
    got = client.responses.retrieve(r1.id)
    client.responses.delete(r1.id)

    def status_of(call):
        try:
            call()
            return 200
        except openai.APIStatusError as e:
            return e.status_code

    unkept = client.responses.create(model=model, input=first, temperature=0,
                                     max_output_tokens=4, store=False)
    return {"continued": r2.output_text, "chat": chat, "previous": r2.previous_response_id,
            "r1": r1.id, "retrieved": got.output_text == r1.output_text,
            "after_delete": status_of(lambda: client.responses.retrieve(r1.id)),
            "unkept_store": unkept.store,
            "unkept": status_of(lambda: client.responses.retrieve(unkept.id))}


def refusals(client, model):
    cases = {
        "previous_response_id": {"previous_response_id": "resp_nowhere"},
        "hosted_tool": {"tools": [{"type": "web_search"}]},
        "image": {"input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "https://example.com/a.png"}]}]},
    }
    out = {}
    for name, extra in cases.items():
        kw = {"model": model, "input": "Hi", "max_output_tokens": 2, **extra}
        try:
            client.responses.create(**kw)
            out[name] = {"status": 200}
        except openai.APIStatusError as e:
            body = e.body if isinstance(e.body, dict) else {}
            out[name] = {"status": e.status_code, "param": body.get("param"),
                         "message": body.get("message", str(e))[:300]}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    host = urlparse(args.base_url).hostname
    assert host in ("127.0.0.1", "localhost"), "a local gateway only"
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", max_retries=0, timeout=120)
    out = {"texts": texts(client, args.model), "stream": streamed(client, args.model),
           "logprobs": logprobs(client, args.model), "parsed": parsed(client, args.model),
           "calls": calls(client, args.model), "kept": kept(client, args.model),
           "refused": refusals(client, args.model)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
