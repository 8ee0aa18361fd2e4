#!/usr/bin/env python3
"""Structured outputs: does every JSON-schema-constrained answer of ferrite parse and validate?

For each schema of tests/fixtures/schemas/schemas.json (see pick.py there), asks the chat endpoint,
with the official `openai` client and greedy decoding, for an example value under
response_format {"type": "json_schema", ...}, and sorts the answer into one class:

  valid      parses (json.loads) and validates (jsonschema, the schema's draft, formats checked)
  invalid    does not, and the model stopped on its own
  truncated  does not, and finish_reason is "length": the output hit --max-tokens
  refused    the server answered 400: its message is llguidance's reason for rejecting the schema
  error      anything else: a timeout, another status, a malformed reply

Prints markdown tables (counts, refusals by reason, every invalid/truncated/error id), writes each
schema's result to --out, and exits 0 only when nothing is invalid, truncated or an error;
refusals are allowed, as they are reported. By hand, against a running gateway:

    python3 tests/clients/structured_validity.py --base-url http://127.0.0.1:8000/v1 \\
        --model smollm2-135m --schemas tests/fixtures/schemas/schemas.json --out report.json
"""

import argparse
import json
import sys
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from urllib.parse import urlparse

import openai
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from jsonschema.validators import validator_for

CLASSES = ("valid", "refused", "invalid", "truncated", "error")
FAILING = ("invalid", "truncated", "error")
TIMEOUT_S = 120.0
# llguidance enforces formats in every draft, with 2020-12's meanings, so every schema is checked
# with 2020-12's FormatChecker. (A bare FormatChecker() would be wrong: it mixes the drafts' checkers
# and its "time" is draft 3's, which rejects "08:30:06Z".)
FORMATS = Draft202012Validator.FORMAT_CHECKER


def describe(entry):
    """The short description that goes in the user message: title, description or test case."""
    schema, source = entry["schema"], entry["source"]
    for text in (schema.get("title"), schema.get("description"), source.get("catalog_name"),
                 source.get("case")):
        if isinstance(text, str) and text.strip():
            return " ".join(text.split())[:200]
    return entry["id"]


def reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def check(schema, content, finish_reason):
    """Classify one answer's content: ("valid", None), or ("invalid" or "truncated", why)."""
    failed = "truncated" if finish_reason == "length" else "invalid"
    if content is None:
        return failed, "no content"
    try:
        # Python's json takes NaN and Infinity, which JSON (and so any schema) does not.
        value = json.loads(content, parse_constant=reject_constant)
    except ValueError as e:
        return failed, f"not JSON: {e}"
    cls = validator_for(schema, default=Draft202012Validator)
    error = best_match(cls(schema, format_checker=FORMATS).iter_errors(value))
    if error is None:
        return "valid", None
    return failed, f"{error.json_path}: {error.message}"[:500]


def error_message(e):
    """The message of an API error: the body's error.message if it has one."""
    if isinstance(e.body, dict) and isinstance(e.body.get("message"), str):
        return e.body["message"]
    return str(e)


def ask(client, model, index, entry, max_tokens, frequency_penalty):
    """Send one schema and classify the answer; never raises, so one failure stops nothing."""
    result = {"index": index, "id": entry["id"], "features": entry["features"]}
    # The schema itself goes in the prompt (as JSONSchemaBench does): a small model that does
    # not see it nests "any" values without end.
    schema_text = json.dumps(entry["schema"], separators=(",", ":"))[:2000]
    messages = [
        {"role": "system", "content": "Answer with one short JSON value and nothing else."},
        {"role": "user", "content": f"{describe(entry)}\nA short JSON value valid under this schema:\n{schema_text}"},
    ]
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": f"s{index}", "schema": entry["schema"], "strict": False},
    }
    try:
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                               frequency_penalty=frequency_penalty,
                                               temperature=0, response_format=response_format)
        choice = reply.choices[0]
        status, reason = check(entry["schema"], choice.message.content, choice.finish_reason)
        result.update(status=status, reason=reason, finish_reason=choice.finish_reason,
                      content=choice.message.content,
                      completion_tokens=reply.usage.completion_tokens if reply.usage else None)
    except openai.BadRequestError as e:
        result.update(status="refused", reason=error_message(e))
    except Exception as e:  # a timeout, another status, a reply without choices: noted, run goes on
        result.update(status="error", reason=f"{type(e).__name__}: {e}")
    return result


def cell(text, limit=None):
    """Text made safe for one markdown table cell."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if limit is None or len(text) <= limit else text[:limit] + "…"


def report(results, entries):
    """The markdown summary printed at the end of a run."""
    counts = Counter(r["status"] for r in results)
    lines = [f"## Structured outputs: {len(results)} schemas", "", "| class | count |", "| --- | --- |"]
    lines += [f"| {c} | {counts[c]} |" for c in CLASSES]

    refusals = defaultdict(list)
    for r in results:
        if r["status"] == "refused":
            first_line = (r["reason"].strip().splitlines() or [""])[0]
            refusals[cell(first_line, 100)].append(r["id"])
    if refusals:
        lines += ["", "### Refused, by reason", "", "| reason | count | example ids |", "| --- | --- | --- |"]
        for reason, ids in sorted(refusals.items(), key=lambda item: (-len(item[1]), item[0])):
            lines.append(f"| {reason} | {len(ids)} | {', '.join(ids[:3])} |")

    failures = [r for r in results if r["status"] in FAILING]
    if failures:
        lines += ["", "### Invalid, truncated and errors", "", "| id | class | finish_reason | reason |",
                  "| --- | --- | --- | --- |"]
        lines += [f"| {r['id']} | {r['status']} | {r.get('finish_reason') or ''} | {cell(r['reason'], 200)} |"
                  for r in failures]

    # A format this jsonschema install has no checker for passes as any string; say which ones.
    used = {tag.split(":", 1)[1] for e in entries for tag in e["features"] if tag.startswith("format:")}
    unchecked = sorted(used - set(FORMATS.checkers))
    if unchecked:
        lines += ["", f"Formats not checked here (jsonschema lacks a checker, or none exists): {', '.join(unchecked)}."]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1 (loopback)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--schemas", required=True, help="tests/fixtures/schemas/schemas.json")
    parser.add_argument("--out", required=True, help="where the per-schema results go (JSON)")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=8)
    # Greedy decoding of a small model falls into loops ("2020-2020-…") that never close the
    # JSON; a frequency penalty breaks most of them.
    parser.add_argument("--frequency-penalty", type=float, default=0.0)
    parser.add_argument("--limit", type=int, help="only the first N schemas")
    parser.add_argument("--api-key", default="unused")
    args = parser.parse_args()
    if urlparse(args.base_url).hostname not in ("127.0.0.1", "localhost", "::1"):
        sys.exit(f"refusing a non-loopback address {args.base_url}")

    with open(args.schemas) as f:
        entries = json.load(f)[: args.limit]
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=TIMEOUT_S)

    results = []
    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        futures = [pool.submit(ask, client, args.model, i, e, args.max_tokens, args.frequency_penalty) for i, e in enumerate(entries)]
        for done, future in enumerate(as_completed(futures), 1):
            r = future.result()
            results.append(r)
            print(f"[{done}/{len(entries)}] {r['id']}: {r['status']}", file=sys.stderr, flush=True)
    results.sort(key=lambda r: r["index"])

    counts = Counter(r["status"] for r in results)
    with open(args.out, "w") as f:
        json.dump({"base_url": args.base_url, "model": args.model, "max_tokens": args.max_tokens,
                   "frequency_penalty": args.frequency_penalty,
                   "counts": {c: counts[c] for c in CLASSES}, "results": results}, f, indent=1)
    print(report(results, entries))
    sys.exit(1 if any(counts[c] for c in FAILING) else 0)


if __name__ == "__main__":
    main()
