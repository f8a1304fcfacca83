"""A service with nothing but its HTTP server: the probes, /metrics, and the scheduler
extender's verbs with the extender's own body limits (each answering with the size it read).

Run as ``python -m tests.integration.runtime.http_service``; settings from the environment.
"""

from __future__ import annotations

import json
import sys
from typing import ClassVar

from neuron_dra_common.runtime import Service, serve
from neuron_dra_common.settings import ServiceSettings
from neuron_dra_scheduler_extender.verbs import body_limits


class HttpSettings(ServiceSettings, frozen=True, kw_only=True):
    """A service of the runtime's own: it does not use the bus, so needs no credentials."""

    bus_credentials: ClassVar[tuple[str, ...]] = ()


async def echo(body: bytes | bytearray) -> tuple[int, bytes]:
    return 200, json.dumps({"read": len(body)}).encode()


async def build(settings: ServiceSettings) -> Service:
    service = Service(name="http-example", settings=settings)
    for path, limit in body_limits().items():
        service.http.add_json_post(path, echo, max_body=limit)
    return service


if __name__ == "__main__":
    raise SystemExit(
        serve(HttpSettings, build, name="http-example", prog="http-example", argv=sys.argv[1:])
    )
