"""``neuron-dra-discovery``: settings, wiring, run.

The settings are read before anything else is imported: ``--help`` and a bad setting answer
at once, without loading the bus or the HTTP server.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from neuron_dra_common.runtime import Service

    from neuron_dra_discovery.settings import DiscoverySettings

__all__ = ["build", "main"]

NAME = "discovery"
PROG = "neuron-dra-discovery"


async def build(settings: DiscoverySettings) -> Service:
    """Connect to the bus and wire the agent into a service."""
    from neuron_dra_common.bus import AlivePublisher, Bus, credentials_of, inbox_prefix, limits_of
    from neuron_dra_common.driver import package_version
    from neuron_dra_common.liveness import Heartbeat, kubelet_probe
    from neuron_dra_common.runtime import Service

    from neuron_dra_discovery.agent import Agent, hardware_reader, make_tracker

    bus = await Bus.connect(
        settings.nats_servers,
        name=f"{NAME}-{settings.node_name}",
        limits=limits_of(settings),
        credentials=credentials_of(settings),
        inbox=inbox_prefix(NAME, node=settings.node_name),
    )
    # Streams are declared in one place; reconciling them is idempotent and cheap.
    await bus.reconcile(replicas=settings.stream_replicas)
    publisher = bus.publisher(source=f"/neuron-dra/{NAME}/{settings.node_name}")
    tracker = make_tracker(
        settings, dra_driver_version=settings.dra_driver_version or package_version()
    )
    agent = Agent(
        publisher=publisher,
        tracker=tracker,
        read=hardware_reader(settings),
        poll_seconds=settings.poll_seconds,
    )
    heartbeat = Heartbeat(
        publisher=publisher,
        node=settings.node_name,
        boot_id=tracker.boot_id,
        interval=settings.liveness_seconds,
        probe=kubelet_probe(settings.kubelet_healthz_url) if settings.kubelet_healthz_url else None,
        mode=settings.heartbeat_mode,
        alive=AlivePublisher(bus.js, node=settings.node_name),
    )
    service = Service(name=NAME, settings=settings)
    service.add_task("inventory", agent.run, stop=agent.stop, ready=lambda: agent.ready)
    service.add_task("heartbeat", heartbeat.run, stop=heartbeat.stop)
    service.add_readiness("nats", lambda: bus.connected)
    service.on_shutdown(bus.close)
    return service


def main(argv: Sequence[str] | None = None) -> int:
    from neuron_dra_common.settings import SettingsError, load

    from neuron_dra_discovery.settings import DiscoverySettings

    try:
        settings = load(DiscoverySettings, argv=sys.argv[1:] if argv is None else argv, prog=PROG)
    except SettingsError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2

    from neuron_dra_common.runtime.process import run

    async def wire() -> Service:
        return await build(settings)

    return run(wire, name=NAME, settings=settings)
