"""``neuron-dra-health-probe``: settings, wiring, run.

The settings are read before anything else is imported: ``--help`` and a bad setting answer
at once, without loading the bus, the Kubernetes client or the HTTP server.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from neuron_dra_common.runtime import Service

    from neuron_dra_health_monitor.probe_settings import ProbeSettings

__all__ = ["build", "main"]

NAME = "health-probe"
PROG = "neuron-dra-health-probe"


async def build(settings: ProbeSettings) -> Service:
    """Connect to the bus (and the API), take back the published health, wire the probe."""
    from pathlib import Path

    from neuron_dra_common.bus import Bus, credentials_of, inbox_prefix, limits_of, replay
    from neuron_dra_common.bus.declarations import HEALTH
    from neuron_dra_common.events import DeviceHealthChanged
    from neuron_dra_common.events.base import SUBJECT_ROOT, subject_token
    from neuron_dra_common.runtime import Service

    from neuron_dra_health_monitor.probe import Probe, load_state
    from neuron_dra_health_monitor.probe_logs import open_kernel_log
    from neuron_dra_health_monitor.probestate import (
        ACCELERATED_HARDWARE_CONDITION,
        NEURON_HEALTH_CONDITION,
        HealthBook,
    )

    bus = await Bus.connect(
        settings.nats_servers,
        name=f"{NAME}-{settings.node_name}",
        limits=limits_of(settings),
        credentials=credentials_of(settings),
        inbox=inbox_prefix(NAME, node=settings.node_name),
    )
    await bus.reconcile(replicas=settings.stream_replicas)
    book = HealthBook(node=settings.node_name)
    # What this node's probe published last, per device: a restart neither forgets an error
    # nor reports it again.
    for event in await replay(
        bus,
        name=NAME,
        stream=HEALTH.name,
        subject=f"{SUBJECT_ROOT}.health.{subject_token(settings.node_name)}.>",
        last_per_subject=True,
    ):
        if isinstance(event, DeviceHealthChanged):
            book.seed(event)
    state = load_state(settings.state_path)
    service = Service(name=NAME, settings=settings)
    conditions = None
    if settings.node_conditions:
        from neuron_dra_common.kube import connect

        from neuron_dra_health_monitor.probe_node import ConditionWriter

        kube = await connect(kubeconfig=settings.kubeconfig or None)
        types = {NEURON_HEALTH_CONDITION}
        if settings.accelerated_hardware_condition:
            types.add(ACCELERATED_HARDWARE_CONDITION)
        writer = ConditionWriter(kube, node=settings.node_name, types=frozenset(types))

        async def conditions_sink(wanted: dict[str, tuple[str, str, str]]) -> bool:
            from datetime import UTC, datetime

            return await writer.write(wanted, now=datetime.now(UTC))

        conditions = conditions_sink
        service.on_shutdown(kube.close)
    probe = Probe(
        node=settings.node_name,
        root=Path(settings.host_root),
        kernel_log=open_kernel_log(settings.kernel_log, cursor=state.log or None),
        publisher=bus.publisher(source=f"/neuron-dra/{NAME}/{settings.node_name}"),
        book=book,
        state=state,
        state_path=settings.state_path,
        poll_seconds=settings.poll_seconds,
        log_poll_seconds=settings.log_poll_seconds,
        conditions=conditions,
        instance_type=settings.instance_type,
    )
    service.add_task("probe", probe.run, stop=probe.stop, ready=lambda: probe.ready)
    service.add_readiness("nats", lambda: bus.connected)
    service.on_shutdown(bus.close)
    return service


def main(argv: Sequence[str] | None = None) -> int:
    from neuron_dra_common.settings import SettingsError, load

    from neuron_dra_health_monitor.probe_settings import ProbeSettings

    try:
        settings = load(ProbeSettings, argv=sys.argv[1:] if argv is None else argv, prog=PROG)
    except SettingsError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2

    from neuron_dra_common.runtime.process import run

    async def wire() -> Service:
        return await build(settings)

    return run(wire, name=NAME, settings=settings)


if __name__ == "__main__":
    raise SystemExit(main())
