#!/usr/bin/env python3
"""Renders a kustomization of deploy/kubernetes with `kubectl kustomize`.

    python tests/kubernetes/render.py overlays/cpu          # the objects, as one JSON list
    python tests/kubernetes/render.py --yaml overlays/cpu   # kubectl's YAML, as it printed it

Run with the interpreter of target/k8s-tools (tests/kubernetes/tools.sh), which has PyYAML and
kubectl; the rehearsal test (tests/tests/kubernetes/) reads the JSON. kubectl is taken from
$FERRITE_KUBECTL, else from beside this interpreter, else from the PATH.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"


def kubectl():
    """The kubectl to render with."""
    explicit = os.environ.get("FERRITE_KUBECTL")
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "kubectl"
    if beside.exists():
        return str(beside)
    found = shutil.which("kubectl")
    if not found:
        sys.exit("render.py: no kubectl (run tests/kubernetes/tools.sh, or set FERRITE_KUBECTL)")
    return found


def kustomizations():
    """Every kustomization a user applies, relative to deploy/kubernetes: the overlays and the
    examples (the base and the components render only as parts of those)."""
    found = [p.parent for kind in ("overlays", "examples") for p in KUBERNETES.glob(f"{kind}/*/kustomization.yaml")]
    return sorted(str(p.relative_to(KUBERNETES)) for p in found)


def render_yaml(name):
    out = subprocess.run([kubectl(), "kustomize", str(KUBERNETES / name)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {name} failed:\n{out.stderr}")
    return out.stdout


def render(name):
    """The objects `kubectl kustomize deploy/kubernetes/<name>` renders."""
    return [d for d in yaml.safe_load_all(render_yaml(name)) if d]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kustomization", help="relative to deploy/kubernetes, e.g. overlays/cpu")
    parser.add_argument("--yaml", action="store_true", help="print kubectl's YAML instead of JSON")
    args = parser.parse_args()
    if args.yaml:
        sys.stdout.write(render_yaml(args.kustomization))
    else:
        json.dump(render(args.kustomization), sys.stdout)
        print()


if __name__ == "__main__":
    main()
