"""Read traces back from the stack's Jaeger (its query API, OTLP JSON) as a user's tool would."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.fixtures.stack import KubeStack


@dataclass(frozen=True)
class Span:
    """One span of a trace, with the resource (process) that sent it."""

    span_id: str
    parent_id: str
    name: str
    service: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    links: tuple[str, ...]
    start_ns: int
    end_ns: int
    error: bool


@dataclass(frozen=True)
class Trace:
    trace_id: str
    spans: tuple[Span, ...] = field(default=())

    def named(self, name: str, *, service: str | None = None) -> list[Span]:
        return [s for s in self.spans if s.name == name and service in (None, s.service)]

    def one(self, name: str, *, service: str) -> Span:
        found = self.named(name, service=service)
        assert len(found) == 1, (
            f"trace {self.trace_id}: want one span {name!r} of {service}, got {len(found)}; "
            f"spans: {sorted((s.service, s.name) for s in self.spans)}"
        )
        return found[0]

    def by_id(self, span_id: str) -> Span | None:
        return next((s for s in self.spans if s.span_id == span_id), None)

    def ancestors(self, span: Span) -> list[Span]:
        chain = []
        parent = self.by_id(span.parent_id)
        while parent is not None:
            chain.append(parent)
            parent = self.by_id(parent.parent_id)
        return chain


def _value(v: dict[str, Any]) -> Any:
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", ())]
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in v:
            return v[key]
    if "intValue" in v:
        return int(v["intValue"])
    return None


def _attrs(items: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {a["key"]: _value(a["value"]) for a in items or ()}


def ui_port(stack: KubeStack) -> int:
    state = json.loads((stack.state_dir / "state.json").read_text())
    [jaeger] = [c for c in state["components"] if c["kind"] == "jaeger"]
    return int(jaeger["ports"]["ui"])


def get_trace(stack: KubeStack, trace_id: str) -> Trace:
    """The trace as Jaeger holds it now (empty when it holds none of it yet)."""
    url = f"http://127.0.0.1:{ui_port(stack)}/api/v3/traces/{trace_id}"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return Trace(trace_id)
        raise
    spans = []
    for rs in body["result"]["resourceSpans"]:
        resource = _attrs(rs["resource"].get("attributes"))
        for ss in rs.get("scopeSpans", ()):
            for s in ss.get("spans", ()):
                spans.append(
                    Span(
                        span_id=s["spanId"],
                        parent_id=s.get("parentSpanId", ""),
                        name=s["name"],
                        service=resource.get("service.name", ""),
                        attributes=_attrs(s.get("attributes")),
                        resource=resource,
                        links=tuple(link["spanId"] for link in s.get("links", ())),
                        start_ns=int(s["startTimeUnixNano"]),
                        end_ns=int(s["endTimeUnixNano"]),
                        error=(s.get("status") or {}).get("code") == 2,
                    )
                )
    return Trace(trace_id, tuple(spans))


def _rfc3339(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def find_traces(stack: KubeStack, *, service: str, operation: str) -> list[str]:
    """Ids of the recent traces holding a span ``operation`` of ``service``."""
    now = datetime.now(UTC)
    query = urllib.parse.urlencode(
        {
            "query.service_name": service,
            "query.operation_name": operation,
            "query.start_time_min": _rfc3339(now - timedelta(hours=1)),
            "query.start_time_max": _rfc3339(now + timedelta(minutes=1)),
            "query.num_traces": "100",
        }
    )
    url = f"http://127.0.0.1:{ui_port(stack)}/api/v3/traces?{query}"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return []
        raise
    return sorted(
        {
            s["traceId"]
            for rs in body["result"]["resourceSpans"]
            for ss in rs.get("scopeSpans", ())
            for s in ss.get("spans", ())
        }
    )
