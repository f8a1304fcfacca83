#!/usr/bin/env bash
# Installs what neuron-dra needs on a fresh machine: uv (pinned) and the workspace's Python
# packages (from uv.lock). Needs only python3 and Go: uv comes from its wheel on PyPI
# (scripts/fetch_uv.py, no pip needed) and is cached beside the Kubernetes builds. Go builds
# the Kubernetes binaries and must be on PATH; it is checked here so the failure is early and
# clear.
#
# Run it (`bash scripts/bootstrap.sh`) or source it: sourced, it leaves uv and the
# workspace's tools (.venv/bin) on PATH for the commands that follow in the same shell.
set -euo pipefail
UV_VERSION=0.13.8
GO_MIN=1.26
_nd_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$_nd_root"

if ! command -v python3 >/dev/null 2>&1; then
  echo "neuron-dra: python3 (3.11 or later) is required" >&2
  exit 1
fi
if ! command -v go >/dev/null 2>&1; then
  echo "neuron-dra: Go is required to build the Kubernetes binaries; install Go >= $GO_MIN and retry" >&2
  exit 1
fi
_nd_go="$(go env GOVERSION | sed 's/^go//')"
if [ "$(printf '%s\n%s\n' "$GO_MIN" "$_nd_go" | sort -V | head -n1)" != "$GO_MIN" ]; then
  echo "neuron-dra: Go $_nd_go is too old; the Kubernetes build needs Go >= $GO_MIN" >&2
  exit 1
fi

if ! command -v uv >/dev/null 2>&1 || [ "$(uv --version | awk '{print $2}')" != "$UV_VERSION" ]; then
  _nd_uv_dir="${XDG_CACHE_HOME:-$HOME/.cache}/neuron-dra/uv/$UV_VERSION"
  _nd_uv="$(python3 scripts/fetch_uv.py "$UV_VERSION" "$_nd_uv_dir")"
  export PATH="$(dirname "$_nd_uv"):$PATH"
fi
echo "==> installing Python packages (uv sync)"
uv sync --frozen --all-packages
export PATH="$_nd_root/.venv/bin:$PATH"
