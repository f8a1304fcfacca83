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
  # The simulated node of kubelet 1.34.1, which the kubelet plugin warns about (tests/e2e/kubeletcheck).
  python -c 'from neuron_dra_cli import kubebuild; [kubebuild.ensure_node_binary(v) for v in kubebuild.NODE_RELEASES]'
fi

echo "==> trace backend (Jaeger), Alertmanager and promtool (built or fetched once, same cache)"
python -m neuron_dra_cli.toolbuild

echo "==> container engine for the image and real-node tests (podman, runc, mmdebstrap, iptables, CNI plugins)"
# The image tests build the Dockerfile and run its containers with Debian's podman and runc
# (podman's network runs iptables, found in /usr/sbin or /sbin even when PATH lacks them);
# the real-node tests run the real kubelet with containerd, runc and Debian's CNI plugins.
# Missing here: installed from Debian's archive when this runs as root on Debian; otherwise
# the image tests are skipped, with this reason in pytest's summary (CI makes a skip a failure:
# NEURON_DRA_REQUIRE_IMAGE_TESTS=1 in .ci/run).
have_engine() { python -c 'import sys; from neuron_dra_cli.imagebuild import missing_tools; sys.exit(1 if missing_tools() else 0)'; }
have_real_node() { python -c 'import sys; from neuron_dra_cli.stack.realnodes import missing_requirements; sys.exit(1 if missing_requirements() else 0)'; }
if have_engine && have_real_node; then
  :
elif [ "$(id -u)" = 0 ] && [ -r /etc/debian_version ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing Debian's podman, runc, mmdebstrap, iptables, CNI plugins and iproute2 (apt-get install --no-install-recommends)"
  export DEBIAN_FRONTEND=noninteractive
  # dpkg runs ldconfig and friends from /usr/sbin and /sbin, which a PATH may lack.
  if ! { PATH="$PATH:/usr/sbin:/sbin" apt-get update -qq && PATH="$PATH:/usr/sbin:/sbin" apt-get install -y -qq --no-install-recommends podman runc mmdebstrap iptables containernetworking-plugins iproute2 >/dev/null; }; then
    echo "could not install them: the image tests will be skipped"
  fi
else
  echo "podman, runc, mmdebstrap, iptables or the CNI plugins missing and this is not root on Debian: the image and real-node tests will be skipped"
fi
if have_engine; then
  echo "==> the image (local Debian base made once, cached; rebuilt only when its inputs change)"
  python -m neuron_dra_cli.imagebuild || echo "the image did not build: the image tests will say why"
fi

echo "==> lint"
ruff check .
ruff format --check .
mypy libs/common/src libs/cli/src services/*/src
mypy bench chaos
mypy tests
lint-imports
codespell

echo "==> tests"
pytest "$@"
