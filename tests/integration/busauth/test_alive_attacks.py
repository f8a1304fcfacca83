"""Alive beats (ttl heartbeat mode) under the bus's least privilege: real nats-server running
the component's auth.conf, the real callout, the real apiserver's tokens. A node's agent beats
on its own node's subject only; only the failure detector reads NEURON_ALIVE's beats."""

from __future__ import annotations

import nats.errors
import pytest
from neuron_dra_bus_auth.identities import service_account_of
from neuron_dra_common.bus import AliveView, alive_subject
from neuron_dra_common.bus.declarations import ALIVE
from neuron_dra_common.events import subject_token

from tests.fixtures.natsclients import reported
from tests.integration.busauth.conftest import AuthenticatedBus
from tests.integration.busauth.test_attacks import _agent_token, _as, _declared, _nodes, _raw

pytestmark = pytest.mark.stack

BEAT = {"Nats-TTL": "60s", "Neuron-Seq": "1", "Neuron-Instance": "i1", "Neuron-Boot": "b"}


async def test_only_a_nodes_own_agent_beats_alive_and_only_the_detector_reads_them(
    authenticated_bus: AuthenticatedBus,
) -> None:
    bus = authenticated_bus
    await _declared(bus)
    a, b = _nodes(bus)[:2]
    async with _raw(bus, _agent_token(bus, "discovery", a), "discovery", node=a) as (nc, errors):
        js = nc.jetstream(timeout=2)
        with pytest.raises(nats.errors.TimeoutError):
            await js.publish(alive_subject(b), b"", headers=BEAT)
        assert await reported(errors, f'publish to "{alive_subject(b)}"'), errors
        # Its own node's, beside it: stored.
        ack = await js.publish(alive_subject(a), b"", headers=BEAT)
        assert ack.stream == ALIVE.name
    for role in ("slice-publisher", "reader"):
        token = bus.token_file(service_account_of(role))
        async with _raw(bus, token, role) as (nc, errors):
            js = nc.jetstream(timeout=2)
            with pytest.raises(nats.errors.Error):
                await js.get_last_msg(ALIVE.name, alive_subject(a))
            assert await reported(errors, f'publish to "$JS.API.STREAM.MSG.GET.{ALIVE.name}"')
    token = bus.token_file(service_account_of("failure-detector"))
    async with _as(bus, token, "failure-detector") as detector:
        view = AliveView(detector.nc, detector.js)
        assert await view.tokens() == {subject_token(a)}
        beat = await view.last(a)
        assert beat is not None
        assert (beat.sequence, beat.instance, beat.boot_id) == (1, "i1", "b")
