"""Claim events as a real JetStream server stores them: a claim prepared again on its node is
stored again, and an event a dead process had only queued reaches the stream at the next
start, once."""

from __future__ import annotations

from pathlib import Path

from neuron_dra_common.bus import Bus
from neuron_dra_common.bus.declarations import CLAIMS

from tests.unit.kubelet_plugin.support import TellingProcess


async def _stored(bus: Bus) -> list[tuple[str, str]]:
    """(subject kind, msg id) of every message in the claims stream, in order."""
    info = await bus.js.stream_info(CLAIMS.name)
    stored = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await bus.js.get_msg(CLAIMS.name, seq)
        kind = (msg.subject or "").split(".")[2]
        stored.append((kind, (msg.headers or {})["Nats-Msg-Id"]))
    return stored


async def test_a_claim_prepared_again_is_stored_again_and_a_dead_process_owes_nothing(
    tmp_path: Path, nats_bus: Bus
) -> None:
    publisher = nats_bus.publisher(source="/test")
    dead = TellingProcess(tmp_path)
    await dead.prepare()  # answered; the process dies with the event in its queue

    node = TellingProcess(tmp_path)
    assert node.events.tell_owed(node.preparer.checkpoint) == 1
    await node.unprepare()
    await node.prepare()  # the claim's next pod, well within the 120 s duplicate window
    await node.publish(publisher)

    restarted = TellingProcess(tmp_path)
    assert restarted.events.tell_owed(restarted.preparer.checkpoint) == 0
    await restarted.prepare()  # the kubelet asks again: told again, and dropped as a duplicate
    await restarted.publish(publisher)

    assert await _stored(nats_bus) == [
        ("prepared", "claim-prepared/n1/u1/b1"),
        ("unprepared", "claim-unprepared/n1/u1/b1"),
        ("prepared", "claim-prepared/n1/u1/b1/2"),
    ]
