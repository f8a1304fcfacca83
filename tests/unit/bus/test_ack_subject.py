"""The runner reads delivery numbers from the ack subject as nats-py's ``Msg.metadata`` does."""

from __future__ import annotations

import pytest
from nats.aio.msg import Msg
from neuron_dra_common.bus.runner import ack_numbers


@pytest.mark.parametrize(
    "reply",
    [
        "$JS.ACK.HEALTH.worker.3.1042.17.1700000000000000000.9",
        "$JS.ACK.hub.ACCHASH.HEALTH.worker.3.1042.17.1700000000000000000.9.tok",
        "$JS.ACK.hub.ACCHASH.HEALTH.worker.3.1042.17.1700000000000000000.9",
    ],
)
def test_numbers_match_the_clients_metadata(reply: str) -> None:
    meta = Msg(None, subject="neuron.health.n.d", reply=reply).metadata  # type: ignore[arg-type]
    expected = (meta.num_delivered, meta.sequence.stream, meta.sequence.consumer)
    assert ack_numbers(reply) == expected == (3, 1042, 17)


@pytest.mark.parametrize(
    "reply", ["", "_INBOX.abc", "$JS.ACK.S.C.x.1.1.1.1", "a.b.c.d.e.f.g.h.i", "$JS.ACK.S.C.1"]
)
def test_other_subjects_are_not_ack_subjects(reply: str) -> None:
    assert ack_numbers(reply) is None
