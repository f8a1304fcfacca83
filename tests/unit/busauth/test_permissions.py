"""Who may do what on the bus, read from the pure permission model."""

from __future__ import annotations

import pytest
from neuron_dra_bus_auth.permissions import (
    ALLOCATOR_SUBJECT,
    CLUSTER_SERVICES,
    NODE_AGENTS,
    ROLES,
    ClusterService,
    permissions_for,
)
from neuron_dra_common.bus.declarations import STREAMS, inbox_prefix
from neuron_dra_common.bus.rpc import ALLOCATOR_SUBJECT as RPC_ALLOCATOR_SUBJECT

NODE = "ip-10-0-0-1.ec2.internal"


def _all(role: str) -> tuple[str, ...]:
    node = NODE if role in NODE_AGENTS else ""
    grants = permissions_for(role, node=node)  # type: ignore[arg-type]
    return grants.publish + grants.subscribe


def test_the_allocator_subject_is_the_bus_one() -> None:
    assert ALLOCATOR_SUBJECT == RPC_ALLOCATOR_SUBJECT


def test_discovery_publishes_only_its_own_nodes_inventory() -> None:
    publish = permissions_for("discovery", node=NODE).publish
    assert "neuron.inventory.ip-10-0-0-1_ec2_internal" in publish
    assert "neuron.heartbeat.ip-10-0-0-1_ec2_internal" in publish
    assert not [s for s in publish if s.startswith("neuron.inventory.") and "10-0-0-1" not in s]
    assert not [s for s in publish if s.endswith(">") and s.startswith("neuron.inventory")]


@pytest.mark.parametrize("role", NODE_AGENTS)
def test_a_node_agent_needs_its_node(role: str) -> None:
    with pytest.raises(ValueError, match=f"identity {role}: a node agent needs its node"):
        permissions_for(role)  # type: ignore[arg-type]


def test_a_cluster_service_is_bound_to_no_node() -> None:
    with pytest.raises(ValueError, match="only node agents are bound to a node"):
        permissions_for("slice-publisher", node=NODE)


@pytest.mark.parametrize("role", [r for r in ROLES if r != "admin"])
def test_only_admin_changes_streams(role: str) -> None:
    for grant in _all(role):
        assert grant not in (">", "$JS.>", "$JS.API.>", "$JS.API.STREAM.>"), (role, grant)
        for verb in ("CREATE", "UPDATE", "DELETE", "PURGE"):
            assert not grant.startswith(f"$JS.API.STREAM.{verb}"), (role, grant)
        assert not grant.startswith("$JS.API.CONSUMER.DELETE"), (role, grant)


def test_admin_may_do_everything() -> None:
    grants = permissions_for("admin")
    assert grants.publish == (">",)
    assert grants.subscribe == (">",)


@pytest.mark.parametrize("role", [r for r in ROLES if r not in ("ultraserver-operator", "admin")])
def test_only_the_operator_asks_the_allocator(role: str) -> None:
    assert ALLOCATOR_SUBJECT not in _all(role)


def test_only_the_allocator_answers_it_in_its_queue_group() -> None:
    for role in ROLES:
        answers = [s for s in _all(role) if s.startswith(ALLOCATOR_SUBJECT + " ")]
        if role == "topology-allocator":
            assert answers == [f"{ALLOCATOR_SUBJECT} topology-allocator"]
            assert permissions_for(role).respond
        else:
            assert answers == [], role


@pytest.mark.parametrize("role", CLUSTER_SERVICES)
def test_every_service_may_check_every_stream(role: ClusterService) -> None:
    publish = permissions_for(role).publish
    for stream in STREAMS:
        assert f"$JS.API.STREAM.INFO.{stream.name}" in publish


def test_the_failure_detector_publishes_node_health_not_device_health() -> None:
    publish = permissions_for("failure-detector").publish
    assert "neuron.health.*.node" in publish
    assert not [s for s in publish if s.startswith("neuron.health.") and s.endswith(">")]


def test_the_reader_publishes_no_event() -> None:
    publish = permissions_for("reader").publish
    assert not [s for s in publish if s.startswith("neuron.")]


def test_the_device_plugin_reads_health_and_publishes_its_nodes_heartbeats_only() -> None:
    grants = permissions_for("device-plugin", node=NODE)
    events = [s for s in grants.publish if s.startswith("neuron.")]
    assert events == [
        "neuron.heartbeat.ip-10-0-0-1_ec2_internal",
        "neuron.alive.ip-10-0-0-1_ec2_internal",
        "neuron.deadletter.NEURON_HEALTH.device-plugin-health",
    ]
    assert "$JS.API.CONSUMER.CREATE.NEURON_HEALTH" in grants.publish
    # Besides the stream check every service makes at start, it reads no other stream.
    assert not [
        s
        for s in grants.publish
        if ("INVENTORY" in s or "ALLOCATION" in s) and not s.startswith("$JS.API.STREAM.INFO.")
    ]
    assert grants.subscribe == ("_INBOX.device-plugin.ip-10-0-0-1_ec2_internal.>",)


def _matches(pattern: str, subject: str) -> bool:
    """NATS's subject match: ``*`` one token, ``>`` one or more at the end."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or token not in ("*", have[i]):
            return False
    return len(want) == len(have)


def _identities() -> list[tuple[str, str]]:
    other = "ip-10-0-0-2.ec2.internal"
    return [(role, n) for role in NODE_AGENTS for n in (NODE, other)] + [
        (role, "") for role in ROLES if role not in NODE_AGENTS and role != "admin"
    ]


@pytest.mark.parametrize(("role", "node"), _identities())
def test_an_identity_reads_replies_on_its_own_inbox_only(role: str, node: str) -> None:
    """Nobody but the admin subscribes to every inbox, and no identity's inbox grant covers a
    reply sent to another identity (a JetStream ack, the allocator's answer)."""
    grants = permissions_for(role, node=node)  # type: ignore[arg-type]
    own = inbox_prefix(role, node=node)
    inboxes = [s for s in grants.subscribe if s.startswith("_INBOX")]
    assert inboxes == [f"{own}.>"]
    for other_role, other_node in _identities():
        reply = f"{inbox_prefix(other_role, node=other_node)}.nuid123.1"
        assert _matches(inboxes[0], reply) == ((other_role, other_node) == (role, node)), reply


def test_the_inbox_prefix_is_one_token_per_part() -> None:
    assert inbox_prefix("health-probe", node=NODE) == "_INBOX.health-probe.ip-10-0-0-1_ec2_internal"
    with pytest.raises(ValueError, match=r"identity 'a\.b' is not one subject token"):
        inbox_prefix("a.b")


def test_the_health_probe_publishes_device_health_never_node_lost() -> None:
    grants = permissions_for("health-probe", node=NODE)
    token = "ip-10-0-0-1_ec2_internal"
    device = f"neuron.health.{token}.neurondevice3"
    node_lost = f"neuron.health.{token}.node"

    def allowed(subject: str) -> bool:
        return any(_matches(p, subject) for p in grants.publish) and not any(
            _matches(p, subject) for p in grants.publish_deny
        )

    assert allowed(device)
    assert not allowed(node_lost)
    assert not allowed("neuron.health.ip-10-0-0-2_ec2_internal.neurondevice3")
    assert not allowed(f"neuron.health.{token}.neurondevice3.extra")


@pytest.mark.parametrize("role", [r for r in ROLES if r not in ("failure-detector", "admin")])
def test_only_the_failure_detector_declares_a_node_lost(role: str) -> None:
    node = NODE if role in NODE_AGENTS else ""
    grants = permissions_for(role, node=node)  # type: ignore[arg-type]
    subject = "neuron.health.ip-10-0-0-1_ec2_internal.node"
    allowed = any(_matches(p, subject) for p in grants.publish)
    assert not allowed or any(_matches(p, subject) for p in grants.publish_deny), role


@pytest.mark.parametrize("role", NODE_AGENTS)
def test_a_node_agent_publishes_events_of_its_own_node_only(role: str) -> None:
    """Every event subject a node agent may publish names its own node, in the node's slot."""
    other = "ip-10-0-0-2_ec2_internal"
    grants = permissions_for(role, node=NODE)  # type: ignore[arg-type]
    for kind, subject in (
        ("inventory", f"neuron.inventory.{other}"),
        ("heartbeat", f"neuron.heartbeat.{other}"),
        ("alive", f"neuron.alive.{other}"),
        ("health", f"neuron.health.{other}.neurondevice0"),
        ("claim", f"neuron.claim.prepared.{other}.default.claim"),
    ):
        assert not any(_matches(p, subject) for p in grants.publish), (role, kind)


def test_only_the_failure_detector_reads_the_alive_beats() -> None:
    """NEURON_ALIVE shows who is alive: its messages (MSG.GET) and consumers are the failure
    detector's alone; the stream check every service makes at start stays allowed."""
    alive = "NEURON_ALIVE"
    detector = permissions_for("failure-detector").publish
    assert f"$JS.API.STREAM.MSG.GET.{alive}" in detector
    assert not [s for s in detector if s.startswith("$JS.API.CONSUMER.") and alive in s]
    for role in (*CLUSTER_SERVICES, "reader"):
        if role == "failure-detector":
            continue
        grants = permissions_for(role).publish  # type: ignore[arg-type]
        reads = [s for s in grants if alive in s and s != f"$JS.API.STREAM.INFO.{alive}"]
        assert reads == [], role
        assert f"$JS.API.STREAM.INFO.{alive}" in grants, role
