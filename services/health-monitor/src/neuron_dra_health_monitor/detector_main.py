"""``neuron-dra-failure-detector``: settings, wiring, leader election, run."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from typing import Final

from neuron_dra_common.bus import Bus, consumer, credentials_of, inbox_prefix, limits_of
from neuron_dra_common.runtime import Service, serve

from neuron_dra_health_monitor.detector import Detector, DetectorRules
from neuron_dra_health_monitor.detector_kube import NodeNotes
from neuron_dra_health_monitor.detector_service import DURABLE, FailureDetector
from neuron_dra_health_monitor.detector_settings import DetectorSettings

__all__ = ["build", "main"]

NAME: Final = "failure-detector"


def rules(settings: DetectorSettings) -> DetectorRules:
    return DetectorRules(
        misses=settings.misses,
        min_window=settings.min_window_seconds,
        recover_beats=settings.recover_beats,
        flap_count=settings.flap_count,
        flap_seconds=settings.flap_seconds,
        stable_seconds=settings.stable_seconds,
        restart_grace=settings.restart_grace_seconds,
        reconnect_grace=settings.reconnect_grace_seconds,
    )


async def build(settings: DetectorSettings) -> Service:
    """Connect; judge only while leading (or always, without Kubernetes)."""
    bus = await Bus.connect(
        settings.nats_servers,
        name=NAME,
        limits=limits_of(settings),
        credentials=credentials_of(settings),
        inbox=inbox_prefix(NAME),
    )
    await bus.reconcile(consumers=[consumer(DURABLE)], replicas=settings.stream_replicas)
    kube = None
    if settings.kubernetes:
        from neuron_dra_common.kube import connect

        kube = await connect(kubeconfig=settings.kubeconfig or None)
    stop = asyncio.Event()

    async def lead() -> None:
        # A fresh detector per leadership: it reads back what was declared and waits.
        work = FailureDetector(
            bus=bus,
            detector=Detector(rules(settings)),
            notes=NodeNotes(kube) if kube is not None else None,
            source=f"/neuron-dra/{NAME}",
            poll=settings.alive_poll_seconds,
        )
        await work.prepare()
        runner = bus.runner(consumer(DURABLE), work.handle)

        async def judge() -> None:
            try:
                await work.judge_forever(tick=settings.tick_seconds, stop=stop)
            finally:
                runner.stop()

        try:
            await asyncio.gather(runner.run(), judge())
        finally:
            runner.stop()

    service = Service(name=NAME, settings=settings)
    if kube is not None:
        from neuron_dra_common.kube import Elector

        elector = Elector(
            kube,
            namespace=settings.namespace,
            name=settings.lease_name,
            identity=settings.identity or socket.gethostname(),
            lease_seconds=settings.lease_seconds,
        )
        service.add_task("leader", lambda: elector.serve(lead), stop=elector.stop)
        service.on_shutdown(kube.close)
    else:
        service.add_task("detector", lead, stop=stop.set)
    service.add_readiness("nats", lambda: bus.connected)
    service.on_shutdown(bus.close)
    return service


def main(argv: Sequence[str] | None = None) -> int:
    return serve(DetectorSettings, build, name=NAME, prog="neuron-dra-failure-detector", argv=argv)
