"""A minimal service on the runtime: one consumer runner and one ticking task.

Run as ``python -m tests.integration.runtime.example_service``; settings from the environment.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from neuron_dra_common.bus import Bus, ConsumerSpec, Delivery
from neuron_dra_common.bus.declarations import HEALTH
from neuron_dra_common.errors import SetupError
from neuron_dra_common.events import AnyEvent
from neuron_dra_common.kube import connect
from neuron_dra_common.runtime import Service, run
from neuron_dra_common.settings import ServiceSettings, SettingsError, load

log = logging.getLogger("example")


def main(argv: list[str]) -> int:
    try:
        settings = load(ServiceSettings, argv=argv, prog="example-service")
    except SettingsError as exc:
        print(f"example-service: {exc}", file=sys.stderr)
        return 2

    async def build() -> Service:
        # Lets a test stop the service while it is still wiring up.
        delay = float(os.environ.get("EXAMPLE_BUILD_DELAY", "0"))
        if delay:
            log.info("building")
            await asyncio.sleep(delay)
        # Lets a test fail the start after a Kubernetes client was made and left open.
        kubeconfig = os.environ.get("EXAMPLE_FAIL_AFTER_KUBECONFIG")
        if kubeconfig:
            await connect(kubeconfig=kubeconfig)
            raise SetupError("the example cannot go on")
        bus = await Bus.connect(settings.nats_servers, name="example")
        await bus.reconcile(streams=[HEALTH])

        async def handle(event: AnyEvent, delivery: Delivery) -> None:
            log.info("handled", extra={"seq": delivery.stream_sequence})

        runner = bus.runner(ConsumerSpec(stream=HEALTH.name, durable="example"), handle)
        stopping = asyncio.Event()

        async def tick() -> None:
            ticks = 0
            while True:
                try:
                    await asyncio.wait_for(stopping.wait(), 0.05)
                    return
                except TimeoutError:
                    ticks += 1

        service = Service(name="example", settings=settings)
        service.add_task(
            "health-consumer", runner.run, stop=runner.stop, ready=lambda: runner.ready
        )
        service.add_task("ticker", tick, stop=stopping.set)
        service.add_readiness("nats", lambda: bus.connected)
        service.on_shutdown(bus.close)
        return service

    return run(build, name="example", settings=settings)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
