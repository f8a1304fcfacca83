"""Log lines are JSON with the trace id of the span they were written in."""

from __future__ import annotations

import io
import json
import logging

from neuron_dra_common.telemetry import (
    configure_logging,
    extract_grpc_metadata,
    extract_headers,
    inject_grpc_metadata,
    inject_headers,
    kube_trace_headers,
)
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

TRACER = TracerProvider().get_tracer("test")


def test_json_lines_carry_trace_ids_and_extra_fields() -> None:
    out = io.StringIO()
    configure_logging(service="discovery", stream=out)
    try:
        with TRACER.start_as_current_span("scan") as span:
            logging.getLogger("x").info("found devices", extra={"node": "ip-1", "count": 16})
        logging.getLogger("x").warning("no span")
    finally:
        logging.getLogger().handlers.clear()
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    ctx = span.get_span_context()
    assert first["trace_id"] == format(ctx.trace_id, "032x")
    assert first["span_id"] == format(ctx.span_id, "016x")
    assert (first["message"], first["node"], first["count"]) == ("found devices", "ip-1", 16)
    assert (first["level"], first["service"]) == ("info", "discovery")
    assert "trace_id" not in second


def test_trace_context_survives_headers_grpc_metadata_and_kube_headers() -> None:
    with TRACER.start_as_current_span("hop") as span:
        headers = inject_headers({})
        metadata = inject_grpc_metadata([("x-claim", "a")])
        kube = kube_trace_headers()
    want = span.get_span_context().trace_id
    for ctx in (extract_headers(headers), extract_grpc_metadata(metadata), extract_headers(kube)):
        assert trace.get_current_span(ctx).get_span_context().trace_id == want
    assert metadata[0] == ("x-claim", "a")
