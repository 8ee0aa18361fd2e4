"""Fetches a Prometheus /metrics page and parses it with the official Python client's parser
(prometheus_client.parser), which rejects malformed exposition text.

Prints one JSON object: {"families": {name: type}, "samples": [[name, labels, value], ...]}.
Usage: metrics_parse.py URL
"""

import json
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def main() -> None:
    url = sys.argv[1]
    with urllib.request.urlopen(url, timeout=10) as resp:
        content_type = resp.headers.get("Content-Type", "")
        text = resp.read().decode("utf-8")
    if not content_type.startswith("text/plain"):
        raise SystemExit(f"unexpected content type {content_type!r}")
    families = {}
    samples = []
    for family in text_string_to_metric_families(text):
        families[family.name] = family.type
        for s in family.samples:
            samples.append([s.name, s.labels, s.value])
    print(json.dumps({"families": families, "samples": samples}))


if __name__ == "__main__":
    main()
