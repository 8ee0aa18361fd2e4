#!/usr/bin/env python3
"""`huggingface_hub`'s side of tests/tests/hub.rs: the reference client of the Hub's cache.

    python3 tests/clients/hub_interop.py download REPO --cache DIR [--file F | --allow F...]
    python3 tests/clients/hub_interop.py read REPO --cache DIR

`download` fetches from `$HF_ENDPOINT` into DIR (one file, the files named, or all); `read`
finds REPO's snapshot in DIR without the network (`local_files_only`), as transformers does
with `HF_HUB_OFFLINE=1`. Each prints one JSON object: the path it got, and `huggingface_hub`'s
version.
"""

import argparse
import json

import huggingface_hub
from huggingface_hub import hf_hub_download, snapshot_download, try_to_load_from_cache


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["download", "read"])
    ap.add_argument("repo")
    ap.add_argument("--cache", required=True)
    ap.add_argument("--file")
    ap.add_argument("--allow", nargs="*")
    args = ap.parse_args()
    out = {"version": huggingface_hub.__version__}
    if args.action == "download" and args.file:
        out["path"] = hf_hub_download(args.repo, args.file, cache_dir=args.cache)
    elif args.action == "download":
        out["path"] = snapshot_download(args.repo, cache_dir=args.cache,
                                        allow_patterns=args.allow)
    else:
        out["path"] = snapshot_download(args.repo, cache_dir=args.cache, local_files_only=True)
        config = try_to_load_from_cache(args.repo, "config.json", cache_dir=args.cache)
        out["config"] = config if isinstance(config, str) else None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
