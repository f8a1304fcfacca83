#!/usr/bin/env bash
# The project's test command: bootstrap, build the pinned Kubernetes releases, lint, test.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh

echo "==> Kubernetes binaries (built once, cached under ${XDG_CACHE_HOME:-$HOME/.cache}/neuron-dra)"
neuron-dra dev build
# The oldest supported release only when a selected test runs on it (`-m 'not floor'` skips it).
floor_needed="$(mktemp)"
trap 'rm -f "$floor_needed"' EXIT
pytest --collect-only -q "$@" --floor-needed-file="$floor_needed" >/dev/null
if [ "$(cat "$floor_needed")" = "yes" ]; then
  neuron-dra dev build --k8s-version "$(python -c 'from neuron_dra_cli.kubebuild import FLOOR_VERSION; print(FLOOR_VERSION)')"
fi

echo "==> trace backend (Jaeger), Alertmanager and promtool (built or fetched once, same cache)"
python -m neuron_dra_cli.toolbuild

echo "==> lint"
ruff check .
ruff format --check .
mypy libs/common/src libs/cli/src services/*/src
mypy bench
mypy tests
lint-imports
codespell

echo "==> tests"
pytest "$@"
