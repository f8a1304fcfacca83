#!/usr/bin/env bash
# Installs what neuron-dra needs on a fresh machine: uv (pinned) and the workspace's
# Python packages (from uv.lock). Go is needed for the Kubernetes binaries and must be
# on PATH; it is checked here so the failure is early and clear.
set -euo pipefail
UV_VERSION=0.13.8
cd "$(dirname "$0")/.."

if ! command -v uv >/dev/null 2>&1 || [ "$(uv --version | awk '{print $2}')" != "$UV_VERSION" ]; then
  echo "==> installing uv $UV_VERSION"
  python3 -m pip install --quiet --user "uv==$UV_VERSION" || python3 -m pip install --quiet "uv==$UV_VERSION"
  export PATH="$(python3 -m site --user-base)/bin:$PATH"
fi
if ! command -v go >/dev/null 2>&1; then
  echo "neuron-dra: Go is required to build the Kubernetes binaries; install Go >= 1.26 and retry" >&2
  exit 1
fi
echo "==> installing Python packages (uv sync)"
uv sync --frozen --all-packages
