"""``python -m tests.unit.stack.forked_agent``: a service as small as a service gets.

It runs the product's own service runtime (settings from flags and environment, uvloop, the
probe server, SIGTERM handling), and its one task writes what it sees of its process to the
file ``FORKED_AGENT_REPORT`` names, then waits until the service is stopped.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from pathlib import Path
from typing import ClassVar

from neuron_dra_common.runtime import Service
from neuron_dra_common.runtime.process import serve
from neuron_dra_common.settings import ServiceSettings


class AgentSettings(ServiceSettings, frozen=True, kw_only=True):
    """A service of the runtime's own: it does not use the bus, so needs no credentials."""

    bus_credentials: ClassVar[tuple[str, ...]] = ()


REPORT_ENV = "FORKED_AGENT_REPORT"


async def build(settings: ServiceSettings) -> Service:
    stop = asyncio.Event()

    async def report() -> None:
        loop = asyncio.get_running_loop()
        seen = {
            "pid": os.getpid(),
            "sid": os.getsid(0),
            "argv": sys.argv[1:],
            "log_level": settings.log_level,
            "http_port": settings.http_port,
            "env": os.environ.get("FORKED_AGENT_MARK", ""),
            "main": __name__,
            "loop": type(loop).__module__,
            "python_threads": threading.active_count(),
            "cwd": os.getcwd(),
        }
        path = Path(os.environ[REPORT_ENV])
        path.with_suffix(".tmp").write_text(json.dumps(seen))
        path.with_suffix(".tmp").replace(path)
        await stop.wait()

    service = Service(name="forked-agent", settings=settings)
    service.add_task("report", report, stop=stop.set)
    return service


def main() -> int:
    return serve(AgentSettings, build, name="forked-agent", prog="forked-agent")


if __name__ == "__main__":
    raise SystemExit(main())
