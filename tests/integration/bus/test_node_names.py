"""A node's event under another node's subject, or naming no node, is a dead letter with the
reason; the consumer goes on with the next message. Real JetStream server."""

from __future__ import annotations

from neuron_dra_common.bus import Bus, ConsumerSpec, Delivery, RunnerOptions
from neuron_dra_common.bus.declarations import HEARTBEAT
from neuron_dra_common.events import AnyEvent, encode

from tests.contracts.support import dead_letters, heartbeat, running, wait_until

SPEC = ConsumerSpec(stream=HEARTBEAT.name, durable="test-node-names", ack_wait_seconds=2.0)
FAST = RunnerOptions(backoff=(0.05,), max_attempts=3)


async def test_an_event_whose_subject_names_another_node_is_a_dead_letter(nats_bus: Bus) -> None:
    handled: list[str] = []

    async def handle(event: AnyEvent, delivery: Delivery) -> None:
        handled.append(delivery.subject)

    # node-b's heartbeat sent under node-c's subject (the stream keeps one per subject); then
    # a name that would share the token of ip-10-0-0-1.ec2 but is no node name; then node-a's
    # own heartbeat.
    forged = encode(heartbeat("node-b"))
    await nats_bus.js.publish("neuron.heartbeat.node-c", forged)
    await nats_bus.js.publish(
        "neuron.heartbeat.ip-10-0-0-1_ec2", encode(heartbeat("ip-10-0-0-1_ec2"))
    )
    await nats_bus.publisher(source="/test").publish(heartbeat("node-a"))
    async with running(nats_bus.runner(SPEC, handle, options=FAST)):
        mismatched, misnamed = await dead_letters(nats_bus, at_least=2)
        await wait_until(lambda: handled == ["neuron.heartbeat.node-a"], what="node-a's own")
    assert mismatched.kind == "refused"
    assert mismatched.reason == (
        "node.heartbeat.v1 on neuron.heartbeat.node-c: its body belongs on "
        "neuron.heartbeat.node-b (its body is about node node-b)"
    )
    assert (mismatched.subject, mismatched.payload) == ("neuron.heartbeat.node-c", forged)
    assert misnamed.kind == "decode"
    assert misnamed.reason.startswith(
        "event payload: `$.node` 'ip-10-0-0-1_ec2' is not a node name"
    )
    assert misnamed.consumer == SPEC.durable
