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
from neuron_dra_common.bus.declarations import STREAMS
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
        "neuron.deadletter.NEURON_HEALTH.device-plugin-health",
    ]
    assert "$JS.API.CONSUMER.CREATE.NEURON_HEALTH" in grants.publish
    # Besides the stream check every service makes at start, it reads no other stream.
    assert not [
        s
        for s in grants.publish
        if ("INVENTORY" in s or "ALLOCATION" in s) and not s.startswith("$JS.API.STREAM.INFO.")
    ]
    assert grants.subscribe == ("_INBOX.>",)
