"""``neuron-dra events``: the audit stream, read as a person.

Every decision of the product (inventories, health changes, device taints set and cleared,
lost nodes, allocations, claims prepared, workload states, alerts fired and resolved) is on
``NEURON_AUDIT``. This command reads it from a start time, optionally keeps following, and
keeps what concerns one node, workload or claim::

    $ neuron-dra events --node trn2-48xl-0 --since 1h
    2026-03-01T12:00:00.123Z  device.health  nodes/trn2-48xl-0/devices/neurondevice3  Unhealthy (was Healthy) SRAM_UNCORRECTABLE_ERROR uncorrectable
    2026-03-01T12:00:00.301Z  device.taint   nodes/trn2-48xl-0/devices/neurondevice3  tainted neuron.aws.com/hardware-error=SRAM_UNCORRECTABLE_ERROR:NoExecute - ...
    2026-03-01T12:00:01.456Z  alert.state    alerts/NeuronDeviceUnhealthy/...          firing NeuronDeviceUnhealthy severity=critical

``-o json`` prints each event as a CloudEvents 1.0 JSON line (structured mode), the same
shape the audit service writes to its file. NATS is the local stack's unless
``--nats-servers`` (or ``NEURON_DRA_NATS_SERVERS``) names another.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from neuron_dra_common.events import (
    AlertStateChanged,
    AllocationDecided,
    AllocationReleased,
    AllocationRequested,
    AnyEvent,
    ClaimPrepared,
    ClaimUnprepared,
    DeviceHealthChanged,
    DeviceTaintChanged,
    NodeHeartbeat,
    NodeInventory,
    NodeLost,
    NodeRecovered,
    WorkloadStateChanged,
)

from neuron_dra_cli import paths
from neuron_dra_cli.errors import CliError

if TYPE_CHECKING:
    from neuron_dra_common.bus import BusCredentials

__all__ = ["Filter", "describe", "matches", "parse_since", "register"]

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, *, now: datetime | None = None) -> datetime:
    """``1h``, ``30m``, ``90s``, ``2d`` before now, or an RFC 3339 time.

    >>> parse_since("1h", now=datetime(2026, 3, 1, 12, tzinfo=UTC)).isoformat()
    '2026-03-01T11:00:00+00:00'
    """
    found = _DURATION.match(text.strip())
    if found:
        seconds = float(found.group(1)) * _UNITS[found.group(2)]
        return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise CliError(
            f"--since {text!r}: expected a duration such as 90s, 30m, 1h, 2d, or a time such "
            "as 2026-03-01T12:00:00Z"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _ref(text: str, flag: str) -> tuple[str, str]:
    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name:
        raise CliError(f"{flag} {text!r}: expected NAMESPACE/NAME")
    return namespace, name


class Filter:
    """What to keep: events about a node, a workload or a claim (all given must match)."""

    def __init__(
        self,
        *,
        node: str = "",
        workload: tuple[str, str] | None = None,
        claim: tuple[str, str] | None = None,
    ) -> None:
        self.node = node
        self.workload = workload
        self.claim = claim


def _nodes(event: AnyEvent) -> set[str]:
    if isinstance(event, NodeInventory | NodeHeartbeat | DeviceHealthChanged | DeviceTaintChanged):
        return {event.node}
    if isinstance(event, NodeLost | NodeRecovered | ClaimPrepared | ClaimUnprepared):
        return {event.node}
    if isinstance(event, AllocationDecided | AllocationReleased | AllocationRequested):
        return set(event.nodes)
    if isinstance(event, AlertStateChanged):
        return {event.labels["node"]} if "node" in event.labels else set()
    return set()


def _workload(event: AnyEvent) -> tuple[str, str] | None:
    if isinstance(
        event,
        AllocationDecided | AllocationReleased | AllocationRequested | WorkloadStateChanged,
    ):
        return event.workload.namespace, event.workload.name
    if isinstance(event, AlertStateChanged) and "workload" in event.labels:
        return event.labels.get("namespace", ""), event.labels["workload"]
    return None


def matches(event: AnyEvent, keep: Filter) -> bool:
    """Whether ``event`` is about what ``keep`` asks for."""
    if keep.node and keep.node not in _nodes(event):
        return False
    if keep.workload is not None and _workload(event) != keep.workload:
        return False
    if keep.claim is not None:
        if not isinstance(event, ClaimPrepared | ClaimUnprepared):
            return False
        if (event.claim.namespace, event.claim.name) != keep.claim:
            return False
    return True


def describe(event: AnyEvent) -> str:
    """One short line saying what happened."""
    match event:
        case DeviceHealthChanged():
            parts = [f"{event.health} (was {event.previous})"]
            parts += [p for p in (event.error_type or event.error_code, event.severity) if p]
            if event.reason:
                parts.append(f"- {event.reason}")
            return " ".join(parts)
        case DeviceTaintChanged():
            shown = ", ".join(f"{t.key}={t.value}:{t.effect}" for t in event.taints)
            text = f"tainted {shown}" if shown else "untainted"
            if event.withheld:
                text += " (left out of the pool: the cluster does not serve device taints)"
            return f"{text} - {event.reason}" if event.reason else text
        case NodeLost():
            return f"lost: {event.reason}"
        case NodeRecovered():
            return f"recovered after {event.lost_for_seconds:.0f} s"
        case NodeInventory():
            hw = event.hardware
            return f"inventory generation {event.generation}, {len(hw.devices)} devices"
        case NodeHeartbeat():
            return f"heartbeat {event.sequence}"
        case AllocationDecided():
            if not event.granted:
                return f"refused: {event.reason}"
            return f"granted {', '.join(event.ultraservers)} nodes {', '.join(event.nodes)}"
        case AllocationReleased():
            return f"released {', '.join(event.ultraservers) or 'nothing'}"
        case AllocationRequested():
            return f"requested {event.server_count} x {event.topology_size} nodes"
        case ClaimPrepared():
            text = f"prepared on {event.node}: {', '.join(event.devices)}"
            if event.admin_access:
                text += f" (admin access to {len(event.admin_access)}, holding none of them)"
            return text
        case ClaimUnprepared():
            return f"unprepared on {event.node}: {', '.join(event.devices) or '-'}"
        case WorkloadStateChanged():
            text = f"{event.state} (was {event.previous or '-'})"
            return f"{text} {event.reason}".rstrip()
        case AlertStateChanged():
            severity = event.labels.get("severity", "")
            summary = event.annotations.get("summary", "")
            return f"{event.status} {event.alertname} severity={severity} {summary}".rstrip()
    return ""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "events",
        help="read the audit stream: every decision, from a start time, optionally following",
        description="Read NEURON_AUDIT: inventories, health changes, device taints, lost nodes, "
        "allocations, "
        "claims, workload states and alerts, oldest first.",
    )
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    p.add_argument("--node", default="", help="only events about this node")
    p.add_argument("--workload", default="", metavar="NS/NAME", help="only this workload's")
    p.add_argument("--claim", default="", metavar="NS/NAME", help="only this claim's")
    p.add_argument(
        "--since", default="", help="start this long ago (90s, 30m, 1h, 2d) or at an RFC 3339 time"
    )
    p.add_argument(
        "-o",
        "--output",
        choices=("text", "json"),
        default="text",
        help="text (default), or json: one CloudEvents JSON line per event",
    )
    p.add_argument(
        "--nats-servers",
        default="",
        help="NATS URLs, comma-separated (env NEURON_DRA_NATS_SERVERS; default: the local stack's)",
    )
    p.add_argument(
        "--nats-token-file",
        default="",
        help="on an authenticated bus: a file holding a bus token, e.g. of the "
        "neuron-dra-bus-reader ServiceAccount (`kubectl -n neuron-dra-driver create token "
        "neuron-dra-bus-reader --audience neuron-dra-bus`) (env NEURON_DRA_NATS_TOKEN_FILE; "
        "default on the local stack: its reader's token)",
    )
    p.add_argument(
        "--nats-tls-ca",
        default="",
        help="trust this CA bundle for NATS's TLS certificate (env NEURON_DRA_NATS_TLS_CA; "
        "default on the local stack: its CA)",
    )
    paths.add_state_dir_option(p)
    p.set_defaults(handler=cmd_events)


def _connection(args: argparse.Namespace) -> tuple[list[str], BusCredentials]:
    """The servers and credentials to read with: the flags, their env twins, else the local
    stack's (its reader's token and its CA when it runs the authenticated bus)."""
    from neuron_dra_common.bus import BusCredentials

    given = BusCredentials(
        token_file=args.nats_token_file or os.environ.get("NEURON_DRA_NATS_TOKEN_FILE", ""),
        tls_ca=args.nats_tls_ca or os.environ.get("NEURON_DRA_NATS_TLS_CA", ""),
    )
    text = args.nats_servers or os.environ.get("NEURON_DRA_NATS_SERVERS", "")
    if text:
        return [s.strip() for s in text.split(",") if s.strip()], given
    from neuron_dra_cli.stack import busauth, state

    state_dir = Path(args.state_dir).expanduser() if args.state_dir else paths.default_state_dir()
    current = state.load(state_dir)
    if current is None:
        raise CliError(
            f"no local stack in {state_dir} and no --nats-servers (or NEURON_DRA_NATS_SERVERS)"
        )
    if any(c.kind == busauth.KIND for c in current.components):
        files = busauth.BusAuth(state_dir / "bus-auth")
        given = BusCredentials(
            token_file=given.token_file or str(files.token(busauth.READER)),
            tls_ca=given.tls_ca or str(files.tls_ca),
        )
    return [current.nats_url], given


def cmd_events(args: argparse.Namespace) -> int:
    keep = Filter(
        node=args.node,
        workload=_ref(args.workload, "--workload") if args.workload else None,
        claim=_ref(args.claim, "--claim") if args.claim else None,
    )
    since = parse_since(args.since) if args.since else None
    servers, credentials = _connection(args)
    try:
        return asyncio.run(
            _read(
                servers,
                keep=keep,
                since=since,
                follow=args.follow,
                json=args.output == "json",
                credentials=credentials,
            )
        )
    except KeyboardInterrupt:
        return 0


async def _read(
    servers: list[str],
    *,
    keep: Filter,
    since: datetime | None,
    follow: bool,
    json: bool,
    out: TextIO | None = None,
    credentials: BusCredentials | None = None,
) -> int:
    from neuron_dra_common.bus import Bus, encode_line, inbox_prefix, structured
    from neuron_dra_common.bus.declarations import AUDIT

    stream = out or sys.stdout
    # The connection's reconnect and drain messages are for services' logs, not this output.
    logging.getLogger("neuron_dra_common.bus").setLevel(logging.ERROR)
    try:
        bus = await asyncio.wait_for(
            # It reads as the bus's reader identity, whose replies come back on its own inbox.
            Bus.connect(
                servers,
                name="neuron-dra-events",
                credentials=credentials,
                inbox=inbox_prefix("reader"),
            ),
            10,
        )
    except Exception as exc:
        raise CliError(f"cannot reach NATS at {', '.join(servers)}: {exc}") from exc
    emit: Callable[[str], object] = stream.write
    try:
        from neuron_dra_common.bus import read_history

        async for stored in read_history(bus, stream=AUDIT.name, since=since, follow=follow):
            event = stored.event
            if event is None:
                if not keep.node and keep.workload is None and keep.claim is None and not json:
                    emit(f"{stored.stored_at.isoformat()}  (undecodable: {stored.error})\n")
                continue
            if not matches(event, keep):
                continue
            ce = structured(
                event,
                payload=stored.payload,
                headers=stored.headers,
                fallback_id=f"{AUDIT.name}:{stored.sequence}",
                stored_at=stored.stored_at,
            )
            if json:
                emit(encode_line(ce).decode())
            else:
                kind = event.event_type().rsplit(".", 1)[0]
                emit(f"{ce.time}  {kind:<20} {ce.subject:<48} {describe(event)}\n")
            stream.flush()
    finally:
        await bus.close()
    return 0
