#!/usr/bin/env python3
"""A reasoning model through OpenAI's official `openai` client: its thinking as the client
exposes vLLM's and DeepSeek's extra fields (`reasoning_content` and `reasoning`, in
`model_extra`), whole and streamed, with `chat_template_kwargs` and a JSON schema in the
request, and through the Responses API.

Run by tests/tests/reasoning.rs, or by hand against a gateway serving a reasoning model:

    python3 tests/clients/reasoning_client.py --base-url http://127.0.0.1:8000 --model think \
        --question "Is the sky blue?"

Prints one JSON object with what came back (the Rust test judges it).
"""

import argparse
import json

from openai import OpenAI


def extra(obj, name):
    return (obj.model_extra or {}).get(name)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--question", required=True)
    a = p.parse_args()
    client = OpenAI(base_url=a.base_url + "/v1", api_key="none")
    messages = [{"role": "user", "content": a.question}]
    greedy = dict(model=a.model, messages=messages, temperature=0, max_tokens=16)
    out = {}

    r = client.chat.completions.create(**greedy)
    m = r.choices[0].message
    out["whole"] = {"content": m.content, "reasoning_content": extra(m, "reasoning_content"),
                    "reasoning": extra(m, "reasoning"),
                    "reasoning_tokens": r.usage.completion_tokens_details.reasoning_tokens,
                    "completion_tokens": r.usage.completion_tokens}

    thought, answer, first_role = "", "", None
    for chunk in client.chat.completions.create(**greedy, stream=True):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        first_role = first_role or d.role
        thought += extra(d, "reasoning_content") or ""
        answer += d.content or ""
    out["streamed"] = {"content": answer, "reasoning_content": thought, "role": first_role}

    r = client.chat.completions.create(
        **greedy, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    m = r.choices[0].message
    out["no_thinking"] = {"content": m.content, "reasoning_content": extra(m, "reasoning_content")}

    schema = {"type": "string", "enum": ["NO"]}
    r = client.chat.completions.create(
        **greedy,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "answer", "schema": schema}})
    m = r.choices[0].message
    out["schema"] = {"content": m.content, "reasoning_content": extra(m, "reasoning_content")}

    r = client.responses.create(model=a.model, input=a.question, temperature=0,
                                max_output_tokens=16)
    out["responses"] = {"types": [item.type for item in r.output],
                        "reasoning": [c.text for c in (r.output[0].content or [])],
                        "text": r.output_text,
                        "reasoning_tokens": r.usage.output_tokens_details.reasoning_tokens}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
