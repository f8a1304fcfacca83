"""``neuron-dra-alerts``: settings, wiring, run.

The settings are read before anything else is imported: ``--help`` and a bad setting answer
at once, without loading the bus or the HTTP client.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from neuron_dra_common.runtime import Service

    from neuron_dra_alerts.settings import AlertsSettings

__all__ = ["build", "main"]

NAME = "alerts"
PROG = "neuron-dra-alerts"
#: The durable consumer on NEURON_AUDIT (declared in neuron_dra_common.bus.declarations).
CONSUMER = "alert"


class _Every:
    """Calls ``work`` at once and then every ``seconds`` until stopped; a failure is logged
    and retried at the next tick."""

    def __init__(self, name: str, seconds: float, work: Callable[[], Awaitable[object]]) -> None:
        self.name = name
        self._seconds = seconds
        self._work = work
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        import logging

        log = logging.getLogger(__name__)
        while not self._stop.is_set():
            try:
                await self._work()
            except Exception as exc:  # a periodic job must outlive one failed round
                log.warning("periodic job failed", extra={"job": self.name, "error": repr(exc)})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=self._seconds)


async def build(settings: AlertsSettings) -> Service:
    """Rebuild the alert state from the bus, then run the ``alert`` consumer and the re-send."""
    from neuron_dra_common.bus import Bus, consumer, credentials_of, inbox_prefix, limits_of, replay
    from neuron_dra_common.bus.declarations import ALERTS, ALLOCATION, DEADLETTER
    from neuron_dra_common.events import AlertStateChanged
    from neuron_dra_common.runtime import Service
    from neuron_dra_common.runtime.faults import crash_point

    from neuron_dra_alerts.alertmanager import AlertmanagerClient
    from neuron_dra_alerts.deadletters import DeadLetterWatch
    from neuron_dra_alerts.engine import CRASH_STEPS, CRASH_VARIABLE, Alerter

    bus = await Bus.connect(
        settings.nats_servers,
        name=NAME,
        limits=limits_of(settings),
        credentials=credentials_of(settings),
        inbox=inbox_prefix(NAME),
    )
    spec = consumer(CONSUMER)
    await bus.reconcile(consumers=[spec], replicas=settings.stream_replicas)
    client = AlertmanagerClient(settings.alertmanager_url, timeout=settings.request_timeout)
    publisher = bus.publisher(source=f"/neuron-dra/{NAME}")

    async def record(change: AlertStateChanged, msg_id: str) -> object:
        return await publisher.publish(change, msg_id=msg_id)

    alerter = Alerter(
        sink=client,
        record=record,
        ttl_seconds=settings.alert_ttl_seconds,
        generator_url=settings.generator_url,
        crash=crash_point(CRASH_VARIABLE, CRASH_STEPS),
    )
    alerter.restore(
        await replay(
            bus,
            name=CONSUMER,
            stream=ALERTS.name,
            subject=ALERTS.subjects[0],
            last_per_subject=True,
        ),
        await replay(bus, name=CONSUMER, stream=ALLOCATION.name, subject=ALLOCATION.subjects[0]),
    )
    runner = bus.runner(spec, alerter.handle)
    resend = _Every("resend", settings.resend_seconds, alerter.resend)

    service = Service(name=NAME, settings=settings)
    service.add_task("alert", runner.run, stop=runner.stop, ready=lambda: runner.ready)
    service.add_task("resend", resend.run, stop=resend.stop)
    if settings.deadletter_check_seconds > 0:

        async def last_dead_letter() -> int:
            info = await bus.js.stream_info(DEADLETTER.name)
            return int(info.state.last_seq)

        watch = DeadLetterWatch(
            alerter,
            stream=DEADLETTER.name,
            last_sequence=last_dead_letter,
            quiet_seconds=settings.deadletter_quiet_seconds,
        )
        checks = _Every("deadletters", settings.deadletter_check_seconds, watch.check)
        service.add_task("deadletters", checks.run, stop=checks.stop)
    service.add_readiness("nats", lambda: bus.connected)
    service.on_shutdown(bus.close)
    service.on_shutdown(client.close)
    return service


def main(argv: Sequence[str] | None = None) -> int:
    import sys

    from neuron_dra_common.settings import SettingsError, load

    from neuron_dra_alerts.settings import AlertsSettings

    try:
        settings = load(AlertsSettings, argv=sys.argv[1:] if argv is None else argv, prog=PROG)
    except SettingsError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2

    from neuron_dra_common.runtime.process import run

    async def wire() -> Service:
        return await build(settings)

    return run(wire, name=NAME, settings=settings)
