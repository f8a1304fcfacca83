"""NEURON_ALIVE on a real nats-server: declared with per-message TTLs allowed, an alive beat
is there for its TTL and gone after it, as the failure detector's question sees it."""

from __future__ import annotations

import asyncio
import time

from neuron_dra_common.bus import AlivePublisher, AliveView, Bus
from neuron_dra_common.bus.declarations import ALIVE
from neuron_dra_common.events import subject_token


async def test_an_alive_beat_is_held_for_its_ttl_and_then_dropped(nats_bus: Bus) -> None:
    info = await nats_bus.js.stream_info(ALIVE.name)
    assert info.config.allow_msg_ttl is True
    assert info.config.max_msgs_per_subject == 1
    assert await nats_bus.reconcile(streams=[ALIVE]) == {ALIVE.name: "unchanged"}

    view = AliveView(nats_bus.nc, nats_bus.js)
    assert await view.tokens() == set()
    node = "ip-10-0-0-1.ec2.internal"
    beats = AlivePublisher(nats_bus.js, node=node)
    await beats.publish(ttl=2, sequence=7, instance="i1", boot_id="boot")
    stored = time.monotonic()
    assert await view.tokens() == {subject_token(node)}
    beat = await view.last(node)
    assert beat is not None
    assert (beat.sequence, beat.instance, beat.boot_id) == (7, "i1", "boot")

    while subject_token(node) in await view.tokens():
        assert time.monotonic() - stored < 2.6, "the beat outlived its TTL by 0.6 s"
        await asyncio.sleep(0.05)
    gone = time.monotonic() - stored
    print(f"a 2 s beat dropped after {gone:.2f} s")
    assert gone >= 1.9
    assert await view.last(node) is None
