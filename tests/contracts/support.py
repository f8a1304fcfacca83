"""Helpers shared by the bus tests and the consumer contract suite."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

from neuron_dra_common.bus import (
    Bus,
    ConsumerRunner,
    DeadLetterRecord,
    StreamSpec,
    read_dead_letter,
)
from neuron_dra_common.bus.declarations import DEADLETTER
from neuron_dra_common.events import NodeHeartbeat


async def wait_until(
    condition: Callable[[], bool], *, within: float = 10.0, what: str = "condition"
) -> None:
    """Poll ``condition`` until true; the failure says what was awaited."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running(runner: ConsumerRunner) -> AsyncIterator[ConsumerRunner]:
    """Run ``runner`` in a named task; stop and drain it on exit."""
    task = asyncio.create_task(runner.run(), name=f"runner-{runner.spec.durable}")
    try:
        await wait_until(lambda: runner.ready or task.done(), what="runner ready")
        if task.done():
            task.result()
        yield runner
    finally:
        runner.stop()
        await asyncio.wait_for(task, 10)


async def dead_letters(
    bus: Bus, *, stream: StreamSpec = DEADLETTER, at_least: int = 1, within: float = 10.0
) -> list[DeadLetterRecord]:
    """Every message of the dead-letter stream, read back (waits ``within`` seconds for
    ``at_least``)."""

    async def count() -> int:
        info = await bus.js.stream_info(stream.name)
        return int(info.state.messages)

    deadline = time.monotonic() + within
    while await count() < at_least:
        if time.monotonic() > deadline:
            raise AssertionError(f"fewer than {at_least} dead letters after {within}s")
        await asyncio.sleep(0.05)
    records = []
    info = await bus.js.stream_info(stream.name)
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        raw = await bus.js.get_msg(stream.name, seq)
        records.append(read_dead_letter(raw.data or b"", raw.headers))
    return records


def heartbeat(node: str = "node-a", sequence: int = 1) -> NodeHeartbeat:
    return NodeHeartbeat(node=node, boot_id="boot-1", sequence=sequence, sent_at=datetime.now(UTC))
