# One image for every neuron-dra service; the command picks the service
# (neuron-dra-discovery, neuron-dra-health-probe, neuron-dra-slice-publisher,
# neuron-dra-kubelet-plugin, neuron-dra-topology-allocator, neuron-dra-ultraserver-operator).
FROM python:3.11.14-slim-bookworm AS build
RUN pip install --no-cache-dir uv==0.13.8
WORKDIR /src
COPY pyproject.toml uv.lock ./
COPY libs libs
COPY services services
COPY protos protos
RUN uv sync --frozen --no-dev --all-packages --no-editable

FROM python:3.11.14-slim-bookworm
COPY --from=build /src/.venv /opt/neuron-dra
ENV PATH=/opt/neuron-dra/bin:$PATH PYTHONUNBUFFERED=1
USER 65532:65532
ENTRYPOINT []
