#!/usr/bin/env python3
"""The official `openai` Python client against ferrite's OpenAI-compatible HTTP endpoint.

Run by tests/tests/api.rs (`cargo test`), or by hand against a running gateway:

    python3 tests/clients/openai_client.py --base-url http://127.0.0.1:8000/v1 --prompt "Hello"

Calls models.list, completions (stream and not), chat.completions (stream and not, with and
without stream_options.include_usage), a completion for an unknown model, and requests with
fields ferrite refuses (the legacy functions, echo, n out of range), requests for several
choices (n), and prints one JSON object with what came back; the Rust test compares it with the
gRPC API's answers. Greedy (temperature 0) but for the choices' seeded draws; completions also
set ignore_eos so they produce exactly their max_tokens.
"""

import argparse
import json
import sys
from urllib.parse import urlparse

import openai


def usage_chunks(client, model, messages, greedy, stream_options):
    """The usage of every chunk of a streamed chat that carries one, with its choice count."""
    extra = {"stream_options": stream_options} if stream_options else {}
    found = []
    for chunk in client.chat.completions.create(model=model, messages=messages, stream=True, **greedy, **extra):
        if chunk.usage is not None:
            found.append({"choices": len(chunk.choices), "usage": chunk.usage.model_dump()})
    return found


def refusals(client, model, messages):
    """What ferrite answers to fields it does not serve: status code and the field it names."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    cases = {
        "functions": {"functions": [tool["function"]]},
        "echo": {"extra_body": {"echo": True}},
        "n=0": {"n": 0},
        "n=129": {"n": 129},
    }
    out = {}
    for name, fields in cases.items():
        try:
            client.chat.completions.create(model=model, messages=messages, max_tokens=2, **fields)
            out[name] = {"raised": None}
        except openai.APIStatusError as e:
            body = e.body if isinstance(e.body, dict) else {}
            out[name] = {"status_code": e.status_code, "param": body.get("param"), "message": body.get("message")}
    return out


def several_choices(client, model, prompt, messages):
    """Requests for n choices: whole and streamed, seeded and greedy, and each seeded choice's
    own request (choice i of a request with seed s is drawn with seed s + i)."""
    seeded = {"temperature": 1.0, "max_tokens": 6, "seed": 7, "extra_body": {"ignore_eos": True}}
    out = {}
    whole = client.completions.create(model=model, prompt=prompt, n=3, **seeded)
    out["indexes"] = [c.index for c in whole.choices]
    out["texts"] = [c.text for c in whole.choices]
    out["finishes"] = [c.finish_reason for c in whole.choices]
    out["usage"] = whole.usage.model_dump()
    alone = []
    for i in range(3):
        one = client.completions.create(model=model, prompt=prompt, **{**seeded, "seed": 7 + i})
        alone.append(one.choices[0].text)
    out["alone"] = alone

    texts, finishes, usages = {}, {}, []
    stream = client.completions.create(
        model=model, prompt=prompt, n=3, stream=True, stream_options={"include_usage": True}, **seeded
    )
    for chunk in stream:
        if chunk.usage is not None:
            usages.append({"choices": len(chunk.choices), "usage": chunk.usage.model_dump()})
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.text or "")
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    out["stream"] = {"texts": [texts.get(i) for i in range(3)], "finishes": [finishes.get(i) for i in range(3)],
                     "usage_chunks": usages}

    greedy = {"temperature": 0.0, "max_tokens": 8}
    chat = client.chat.completions.create(model=model, messages=messages, n=2, **greedy)
    out["chat"] = [{"index": c.index, "content": c.message.content} for c in chat.choices]
    contents, roles = {}, {}
    for chunk in client.chat.completions.create(model=model, messages=messages, n=2, stream=True, **greedy):
        for c in chunk.choices:
            contents[c.index] = contents.get(c.index, "") + (c.delta.content or "")
            if c.delta.role:
                roles[c.index] = roles.get(c.index, 0) + 1
    out["chat_stream"] = {"contents": [contents.get(i) for i in range(2)], "roles": [roles.get(i) for i in range(2)]}

    # A batch of two prompts, two choices each, and each prompt alone.
    short = {"temperature": 0.0, "max_tokens": 4, "extra_body": {"ignore_eos": True}}
    prompts = [prompt, messages[0]["content"]]
    batch = client.completions.create(model=model, prompt=prompts, n=2, **short)
    alone = [client.completions.create(model=model, prompt=p, **short) for p in prompts]
    out["batch"] = {
        "indexes": [c.index for c in batch.choices],
        "texts": [c.text for c in batch.choices],
        "usage": batch.usage.model_dump(),
        "alone_texts": [a.choices[0].text for a in alone],
        "alone_prompt_tokens": [a.usage.prompt_tokens for a in alone],
    }
    return out


def echo(client, model, prompt):
    """Scoring with echo, as lm-eval's local-completions asks for loglikelihoods: the prompt
    alone (max_tokens 0), then with 3 tokens after it, whole and streamed."""
    scored = {"echo": True, "logprobs": 1, "temperature": 0.0}
    out = {}
    alone = client.completions.create(model=model, prompt=prompt, max_tokens=0, **scored)
    c = alone.choices[0]
    out["alone"] = {"text": c.text, "finish_reason": c.finish_reason, "usage": alone.usage.model_dump(),
                    "tokens": c.logprobs.tokens, "token_logprobs": c.logprobs.token_logprobs,
                    "top_logprobs": c.logprobs.top_logprobs}
    more = {**scored, "max_tokens": 3, "extra_body": {"ignore_eos": True}}
    whole = client.completions.create(model=model, prompt=prompt, **more)
    c = whole.choices[0]
    out["generated"] = {"text": c.text, "token_logprobs": c.logprobs.token_logprobs,
                        "usage": whole.usage.model_dump()}
    texts, first = [], None
    for chunk in client.completions.create(model=model, prompt=prompt, stream=True, **more):
        for ch in chunk.choices:
            texts.append(ch.text or "")
            if first is None:
                first = {"text": ch.text, "token_logprobs": ch.logprobs.token_logprobs if ch.logprobs else None}
    out["stream"] = {"text": "".join(texts), "first": first}
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1 (loopback)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompt", required=True, help="the completion prompt")
    parser.add_argument("--chat", required=True, help="the user message of the chat")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--timeout-s", type=float, default=60.0)
    args = parser.parse_args()
    if urlparse(args.base_url).hostname not in ("127.0.0.1", "localhost", "::1"):
        sys.exit(f"refusing a non-loopback address {args.base_url}")

    client = openai.OpenAI(base_url=args.base_url, api_key="unused", max_retries=0, timeout=args.timeout_s)
    out = {"openai_version": openai.__version__}

    out["models"] = [m.id for m in client.models.list().data]
    out["model"] = client.models.retrieve(args.model).model_dump()
    try:
        client.models.retrieve("no-such-model")
        out["model_unknown"] = {"raised": None}
    except openai.NotFoundError as e:
        out["model_unknown"] = {"status_code": e.status_code}

    greedy = {"temperature": 0.0, "max_tokens": args.max_tokens}
    completion = client.completions.create(
        model=args.model, prompt=args.prompt, extra_body={"ignore_eos": True}, **greedy
    )
    out["completion"] = {
        "text": completion.choices[0].text,
        "finish_reason": completion.choices[0].finish_reason,
        "usage": completion.usage.model_dump() if completion.usage else None,
        "object": completion.object,
    }

    text, finish, chunks = "", None, 0
    for chunk in client.completions.create(
        model=args.model, prompt=args.prompt, stream=True, extra_body={"ignore_eos": True}, **greedy
    ):
        chunks += 1
        for choice in chunk.choices:
            text += choice.text or ""
            finish = choice.finish_reason or finish
    out["completion_stream"] = {"text": text, "finish_reason": finish, "chunks": chunks}

    messages = [{"role": "user", "content": args.chat}]
    chat = client.chat.completions.create(model=args.model, messages=messages, **greedy)
    out["chat"] = {
        "content": chat.choices[0].message.content,
        "role": chat.choices[0].message.role,
        "finish_reason": chat.choices[0].finish_reason,
        "object": chat.object,
    }

    content, finish, chunks, role = "", None, 0, None
    for chunk in client.chat.completions.create(model=args.model, messages=messages, stream=True, **greedy):
        chunks += 1
        for choice in chunk.choices:
            content += choice.delta.content or ""
            role = choice.delta.role or role
            finish = choice.finish_reason or finish
    out["chat_stream"] = {"content": content, "role": role, "finish_reason": finish, "chunks": chunks}
    out["usage_chunks_unasked"] = usage_chunks(client, args.model, messages, greedy, None)
    out["usage_chunks_asked"] = usage_chunks(client, args.model, messages, greedy, {"include_usage": True})
    out["refused"] = refusals(client, args.model, messages)
    out["choices"] = several_choices(client, args.model, args.prompt, messages)
    out["echo"] = echo(client, args.model, args.prompt)

    try:
        client.completions.create(model="no-such-model", prompt=args.prompt, max_tokens=4)
        out["unknown_model"] = {"raised": None}
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        out["unknown_model"] = {
            "raised": type(e).__name__,
            "status_code": e.status_code,
            "is_not_found_error": isinstance(e, openai.NotFoundError),
            "message": body.get("message"),
            "type": body.get("type"),
            "code": body.get("code"),
            "param": body.get("param"),
        }

    print(json.dumps(out))


if __name__ == "__main__":
    main()
