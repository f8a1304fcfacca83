"""A NeuronUltraServer's Ready and Degraded conditions follow its members' health, including
nodes the failure detector declared lost while Kubernetes still calls them Ready."""

from __future__ import annotations

from neuron_dra_ultraserver_operator.discovery import Member, UltraServerView
from neuron_dra_ultraserver_operator.manifests import ultraserver_status

VIEW = UltraServerView(
    name="us-us0",
    server_id="us0",
    instance_type="trn2u.48xlarge",
    members=tuple(Member(node_name=f"us0-n{i}", node_id=i) for i in range(4)),
)


def conditions(status: dict[str, object]) -> dict[str, tuple[str, str]]:
    found = status["conditions"]
    assert isinstance(found, list)
    return {c["type"]: (c["status"], c["lastTransitionTime"]) for c in found}


def test_a_lost_member_makes_it_degraded_not_ready_and_back() -> None:
    healthy = ultraserver_status(VIEW, [], generation=1, now="2026-01-01T00:00:00Z")
    assert conditions(healthy) == {
        "Ready": ("True", "2026-01-01T00:00:00Z"),
        "Degraded": ("False", "2026-01-01T00:00:00Z"),
    }
    lost = ultraserver_status(
        VIEW,
        [],
        generation=1,
        failed={"us0-n2": "lost (no heartbeat for 3.1 s)"},
        previous=healthy,
        now="2026-01-01T00:01:00Z",
    )
    assert conditions(lost) == {
        "Ready": ("False", "2026-01-01T00:01:00Z"),
        "Degraded": ("True", "2026-01-01T00:01:00Z"),
    }
    assert lost["healthyNodeCount"] == 3
    nodes = lost["nodes"]
    assert isinstance(nodes, list)
    (node,) = [n for n in nodes if n["nodeName"] == "us0-n2"]
    assert node["healthy"] is False
    assert "lost" in node["reason"]
    # Unchanged health: the same status, transition times kept (no write on every pass).
    again = ultraserver_status(
        VIEW,
        [],
        generation=1,
        failed={"us0-n2": "lost (no heartbeat for 3.1 s)"},
        previous=lost,
        now="2026-01-01T00:02:00Z",
    )
    assert again == lost
