# One image for every neuron-dra service; the command picks the service
# (neuron-dra-discovery, neuron-dra-health-probe, neuron-dra-slice-publisher,
# neuron-dra-kubelet-plugin, neuron-dra-topology-allocator, neuron-dra-ultraserver-operator,
# neuron-dra-audit, neuron-dra-alerts, neuron-dra-scheduler-extender, neuron-dra-device-plugin),
# and `neuron-dra` is there for its non-dev commands
# (`neuron-dra topology show`, `--version`).
#
# BASE: any Debian-based image with python3 3.11 (and CA certificates, to reach PyPI while
# building). Both stages use it, so the venv's python is the same interpreter at the same
# path. The tests build from a local Debian base (no registry needed):
#   podman build --build-arg BASE=localhost/neuron-dra-base:<key> -t neuron-dra .
ARG BASE=docker.io/library/python:3.11.14-slim-bookworm

FROM ${BASE} AS build
ARG UV_VERSION=0.13.8
# The venv is built where it runs (entry points' shebangs name /opt/neuron-dra/bin/python),
# from the interpreter of BASE (never one uv downloads), compiled to bytecode so a read-only
# root filesystem costs nothing at start.
ENV UV_PROJECT_ENVIRONMENT=/opt/neuron-dra \
    UV_PYTHON=python3 \
    UV_PYTHON_DOWNLOADS=never \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_CACHE_DIR=/var/cache/uv \
    UV_NATIVE_TLS=1
# uv (and Python) trust the system's CA bundle (UV_NATIVE_TLS): a build behind a
# TLS-inspecting proxy mounts the host's bundle over it for the RUN steps.
# uv from its pinned wheel, checked against its SHA-256, with the standard library only
# (a Debian python3 has no pip).
COPY scripts/fetch_uv.py /tmp/fetch_uv.py
RUN python3 /tmp/fetch_uv.py "$UV_VERSION" /usr/local/lib/uv \
    && ln -s /usr/local/lib/uv/uv /usr/local/bin/uv
WORKDIR /src
# Third-party packages first, in their own layer: rebuilt only when uv.lock or a package's
# metadata changes, not on every source edit.
COPY pyproject.toml uv.lock ./
COPY libs/common/pyproject.toml libs/common/
COPY libs/cli/pyproject.toml libs/cli/
COPY protos/pyproject.toml protos/
COPY services/discovery/pyproject.toml services/discovery/
COPY services/health-monitor/pyproject.toml services/health-monitor/
COPY services/kubelet-plugin/pyproject.toml services/kubelet-plugin/
COPY services/slice-publisher/pyproject.toml services/slice-publisher/
COPY services/topology-allocator/pyproject.toml services/topology-allocator/
COPY services/ultraserver-operator/pyproject.toml services/ultraserver-operator/
COPY services/audit/pyproject.toml services/audit/
COPY services/alerts/pyproject.toml services/alerts/
COPY services/scheduler-extender/pyproject.toml services/scheduler-extender/
COPY services/bus-auth/pyproject.toml services/bus-auth/
COPY services/device-plugin/pyproject.toml services/device-plugin/
# uv's cache (downloads, the build backend) is a cache mount: kept between builds, never in
# a layer.
RUN --mount=type=cache,target=/var/cache/uv,sharing=locked \
    uv sync --frozen --no-dev --all-packages --no-install-workspace
# The workspace's packages, installed as wheels (no editable links to /src). --no-dev leaves
# out the dev group, and with it the CLI's `dev` extra (the local stack's kubectl and
# nats-server): `neuron-dra dev` says so and stops.
COPY libs libs
COPY protos protos
COPY services services
RUN --mount=type=cache,target=/var/cache/uv,sharing=locked \
    uv sync --frozen --no-dev --all-packages --no-editable \
    && /opt/neuron-dra/bin/neuron-dra --version

FROM ${BASE}
COPY --from=build /opt/neuron-dra /opt/neuron-dra
ENV PATH=/opt/neuron-dra/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# Non-root by default. The kubelet plugin's DaemonSet runs it as root: it creates sockets in
# the kubelet's root-owned plugin directories and writes CDI specs to /var/run/cdi.
USER 65532:65532
ENTRYPOINT []
CMD ["neuron-dra", "--help"]
