#!/usr/bin/env python3
"""A local stand-in for the Hugging Face Hub's HTTP API, for tests/tests/hub.rs: huggingface.co
cannot be reached from CI, and this serves the part of the protocol that `huggingface_hub` and
ferrite both speak, so each can download from it and their caches can be compared.

    python3 tests/clients/hub_server.py --root DIR

serves every `DIR/{org}/{name}/` as a model repository at one commit (the sha1 of its files'
names and hashes), and prints `port N` once listening. It answers:

- `GET /api/models/{org}/{name}/revision/{main|commit}`: `{"id", "sha", "siblings": [{
  "rfilename", "size", "blobId", "lfs": {"sha256", "size"}}]}` (LFS for weights: .safetensors,
  .gguf, .bin, .onnx);
- `GET /api/models/{org}/{name}/tree/{main|commit}`: the same files as the tree API lists them
  (one page), which `huggingface_hub`'s `snapshot_download` reads;
- `GET|HEAD /{org}/{name}/resolve/{main|commit}/{path}`: a small file directly (`ETag` its git
  blob id), an LFS file by a 302 to `http://localhost:{port}/cdn/{org}/{name}/{sha256}`
  (`X-Linked-Etag`, `X-Linked-Size`), as the Hub does; both with `X-Repo-Commit`;
- `GET|HEAD /cdn/{org}/{name}/{sha256}`: the bytes, with no token asked; from byte N on with
  `Range: bytes=N-` (206, `Content-Range`; 416 past the end), as the Hub's CDN.

Repositories under the org `gated` answer 401 without `Authorization: Bearer hf_test_token`;
under `corrupt`, the CDN serves each LFS file with its first byte flipped; under `flaky`, a
request for a whole LFS file gets its first half and then a closed connection (a transfer that
breaks), while a range is served whole.
"""

import argparse
import hashlib
import http.server
import json
import os
import socketserver
import sys

LFS = (".safetensors", ".gguf", ".bin", ".onnx")
TOKEN = "hf_test_token"


def file_info(path):
    data = open(path, "rb").read()
    blob_id = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    return {"size": len(data), "blob_id": blob_id, "sha256": hashlib.sha256(data).hexdigest()}


class Repos:
    def __init__(self, root):
        self.root = root
        self.repos = {}
        self.by_sha = {}
        for org in sorted(os.listdir(root)):
            for name in sorted(os.listdir(os.path.join(root, org))):
                self.add(f"{org}/{name}")

    def add(self, repo):
        base = os.path.join(self.root, repo)
        files = {}
        for d, _, names in os.walk(base):
            for n in names:
                full = os.path.join(d, n)
                rel = os.path.relpath(full, base).replace(os.sep, "/")
                files[rel] = dict(file_info(full), path=full, lfs=rel.endswith(LFS))
                self.by_sha[(repo, files[rel]["sha256"])] = full
        digest = hashlib.sha1()
        for rel in sorted(files):
            digest.update(f"{rel}:{files[rel]['sha256']}\n".encode())
        self.repos[repo] = {"sha": digest.hexdigest(), "files": files}

    def siblings(self, repo):
        out = []
        for rel, f in sorted(self.repos[repo]["files"].items()):
            s = {"rfilename": rel, "size": f["size"], "blobId": f["blob_id"]}
            if f["lfs"]:
                s["lfs"] = {"sha256": f["sha256"], "size": f["size"], "pointerSize": 134}
            out.append(s)
        return out


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    repos = None

    def log_message(self, *args):
        pass

    def send(self, status, body=b"", headers=None, content_type="application/json"):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def error(self, status, message):
        self.send(status, json.dumps({"error": message}).encode(),
                  {"X-Error-Message": message})

    def open_repo(self, name, revision):
        """(repo, info) for `org/name` at `revision`, checking the token; None once the error
        is answered (401 for an unknown repository or a missing token, as the Hub does; 404
        for an unknown revision)."""
        repo = "/".join(name)
        info = self.repos.repos.get(repo)
        unauthorized = name[0] == "gated" and \
            self.headers.get("Authorization") != f"Bearer {TOKEN}"
        if info is None or unauthorized:
            return self.error(401, "Invalid credentials in Authorization header")
        if revision not in ("main", info["sha"]):
            return self.error(404, "Revision Not Found")
        return repo, info

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "models"] and len(parts) == 6 and parts[4] == "revision":
            return self.api(parts[2:4], parts[5])
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "tree":
            return self.tree(parts[2:4], parts[5])
        if len(parts) >= 5 and parts[2] == "resolve":
            return self.resolve(parts[:2], parts[3], "/".join(parts[4:]))
        if len(parts) == 4 and parts[0] == "cdn":
            return self.cdn(f"{parts[1]}/{parts[2]}", parts[3])
        self.error(404, "Not found")

    def api(self, name, revision):
        opened = self.open_repo(name, revision)
        if opened is None:
            return
        repo, info = opened
        body = {"id": repo, "modelId": repo, "sha": info["sha"], "private": False,
                "siblings": self.repos.siblings(repo)}
        self.send(200, json.dumps(body).encode())

    def tree(self, name, revision):
        """The tree API (`huggingface_hub`'s `list_repo_tree`, recursive, one page)."""
        opened = self.open_repo(name, revision)
        if opened is None:
            return
        _, info = opened
        entries, dirs = [], set()
        for rel, f in sorted(info["files"].items()):
            parent = rel.rsplit("/", 1)[0] if "/" in rel else None
            if parent and parent not in dirs:
                dirs.add(parent)
                entries.append({"type": "directory", "oid": "0" * 40, "size": 0, "path": parent})
            e = {"type": "file", "oid": f["blob_id"], "size": f["size"], "path": rel}
            if f["lfs"]:
                e["lfs"] = {"oid": f["sha256"], "size": f["size"], "pointerSize": 134}
            entries.append(e)
        self.send(200, json.dumps(entries).encode())

    def resolve(self, name, revision, rel):
        opened = self.open_repo(name, revision)
        if opened is None:
            return
        repo, info = opened
        f = info["files"].get(rel)
        if f is None:
            return self.error(404, "Entry not found")
        common = {"X-Repo-Commit": info["sha"]}
        if f["lfs"]:
            # Another host name for the same server, as the Hub's CDN is another host: a
            # client must not send its token there, and `huggingface_hub` does not follow it
            # when it only asks for the file's headers.
            port = self.server.server_address[1]
            location = f"http://localhost:{port}/cdn/{repo}/{f['sha256']}"
            return self.send(302, b"", dict(common, **{
                "Location": location, "ETag": f'"{f["blob_id"]}"',
                "X-Linked-Etag": f'"{f["sha256"]}"', "X-Linked-Size": str(f["size"])}))
        data = open(f["path"], "rb").read()
        self.send(200, data, dict(common, ETag=f'"{f["blob_id"]}"'), "application/octet-stream")

    def cdn(self, repo, sha):
        full = self.repos.by_sha.get((repo, sha))
        if full is None:
            return self.error(404, "Not found")
        data = bytearray(open(full, "rb").read())
        if repo.startswith("corrupt/") and data:
            data[0] ^= 0xFF
        etag = {"ETag": f'"{sha}"'}
        wanted = self.headers.get("Range", "")
        if wanted.startswith("bytes=") and wanted.endswith("-"):
            start = int(wanted[len("bytes="):-1])
            if start >= len(data):
                return self.send(416, b"", dict(etag, **{"Content-Range": f"bytes */{len(data)}"}))
            rest = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
            return self.send(206, bytes(data[start:]), dict(etag, **rest),
                             "application/octet-stream")
        if repo.startswith("flaky/") and len(data) > 1 and self.command == "GET":
            # Announced whole, cut in half: the client's read ends early.
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            self.wfile.write(bytes(data[: len(data) // 2]))
            self.wfile.flush()
            self.close_connection = True
            return
        self.send(200, bytes(data), etag, "application/octet-stream")


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True)
    args = ap.parse_args()
    Handler.repos = Repos(args.root)
    server = Server(("127.0.0.1", 0), Handler)
    print(f"port {server.server_address[1]}", flush=True)
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
