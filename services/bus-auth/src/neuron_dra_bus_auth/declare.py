"""``neuron-dra-bus-declare``: create or update the bus's streams, as the admin identity.

With the auth callout, only ``neuron-dra-bus-admin`` may create, update, purge or delete
streams; the services only read them at start. This command is the declare step: run once
per install or upgrade (the ``bus-auth`` component's Job, ``neuron-dra dev up``)
with the admin's token in ``NEURON_DRA_NATS_TOKEN_FILE``. It waits for the server for up to
``NEURON_DRA_WAIT_SECONDS``, prints what changed per stream and exits 0, or 1 naming what
failed. It also replaces the durable pull consumers an earlier release left with the push
consumers this one runs, each from where the old one stood (only the admin deletes consumers).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Sequence
from typing import Annotated

import msgspec
from neuron_dra_common.settings import ServiceSettings, SettingsError, load

__all__ = ["DeclareSettings", "declare", "main"]

log = logging.getLogger(__name__)


class DeclareSettings(ServiceSettings, frozen=True, kw_only=True):
    """The stream declarations, applied once with the admin identity."""

    wait_seconds: Annotated[
        float, msgspec.Meta(gt=0, description="How long to wait for the NATS server to admit us")
    ] = 120.0


async def declare(settings: DeclareSettings) -> dict[str, str]:
    """Connect (retrying until ``wait_seconds``), reconcile every stream, replace earlier
    releases' pull consumers; return the changes."""
    from neuron_dra_common.bus import Bus, credentials_of, inbox_prefix, limits_of
    from neuron_dra_common.bus.declarations import CONSUMERS, STREAMS
    from neuron_dra_common.bus.reconcile import replace_pull_consumers

    deadline = time.monotonic() + settings.wait_seconds
    while True:
        try:
            bus = await Bus.connect(
                settings.nats_servers,
                name="bus-declare",
                limits=limits_of(settings),
                credentials=credentials_of(settings),
                inbox=inbox_prefix("admin"),
            )
            break
        except Exception as exc:  # refused, not up yet, or no route: asked again until the deadline
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"NATS {','.join(settings.nats_servers)}: not connected within "
                    f"{settings.wait_seconds:.0f} s: {exc}"
                ) from None
            await asyncio.sleep(1.0)
    changes: dict[str, str] = {}
    try:
        for stream in STREAMS:
            try:
                changes.update(
                    await bus.reconcile(streams=[stream], replicas=settings.stream_replicas)
                )
            except Exception as exc:  # the server's silence or refusal, named by stream
                raise RuntimeError(
                    f"stream {stream.name}: not declared ({exc or type(exc).__name__}); only "
                    "the bus's admin identity may create or update streams"
                ) from None
        changes.update(await replace_pull_consumers(bus.js, CONSUMERS.values()))
    finally:
        await bus.close()
    return changes


def main(argv: Sequence[str] | None = None) -> int:
    prog = "neuron-dra-bus-declare"
    try:
        settings = load(DeclareSettings, argv=sys.argv[1:] if argv is None else argv, prog=prog)
    except SettingsError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    refusal = settings.bus_refusal()
    if refusal:
        print(f"{prog}: {refusal}", file=sys.stderr)
        return 2
    try:
        changes = asyncio.run(declare(settings))
    except Exception as exc:  # reported in one line, with the stream or server named
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    for stream, change in sorted(changes.items()):
        print(f"{stream}: {change}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
