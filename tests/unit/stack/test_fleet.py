"""The fleet file: what a user writes to say which simulated nodes run."""

from __future__ import annotations

from pathlib import Path

import pytest
from neuron_dra_cli.stack.fleet import FleetError, load_fleet, node_labels, parse_fleet

REPO = Path(__file__).resolve().parents[3]


def test_default_fleet_has_the_promised_nodes() -> None:
    fleet = load_fleet(REPO / "deploy" / "fleets" / "default.yaml")
    by_type: dict[str, int] = {}
    for n in fleet.nodes:
        by_type[n.instance_type] = by_type.get(n.instance_type, 0) + 1
    assert by_type["trn2.48xlarge"] >= 4
    assert by_type["trn2u.48xlarge"] >= 4
    assert by_type["inf2.48xlarge"] >= 2
    assert by_type["trn1.32xlarge"] >= 1
    assert len({n.name for n in fleet.nodes}) == len(fleet.nodes)


def test_trn3_fleets_name_their_nodes_as_the_ultraserver_guide_does() -> None:
    fleet = load_fleet(REPO / "tests" / "fleets" / "trn3.yaml")
    assert [n.name for n in fleet.nodes][:4] == [f"us0-trn3pds-48xl-{i}" for i in range(4)]
    assert {n.instance_type for n in fleet.nodes} == {"trn3pds.48xlarge"}
    assert len(fleet.nodes) == 8
    lnc = {n.name: n.lnc for n in load_fleet(REPO / "tests" / "fleets" / "trn3-lnc.yaml").nodes}
    assert lnc == {
        "lnc2-trn2-0": None,
        "lnc1-trn2-0": 1,
        **{f"lnc1-trn3-{i}": 1 for i in range(4)},
    }
    with pytest.raises(FleetError, match=r"trn3pds.48xlarge nodes come in UltraServers"):
        parse_fleet("nodes:\n  - instanceType: trn3pds.48xlarge\n", source="f.yaml")


def test_ultraserver_members_get_node_ids_and_eks_labels() -> None:
    fleet = parse_fleet(
        "ultraServers:\n  - instanceType: trn2u.48xlarge\n    count: 2\n", source="f.yaml"
    )
    assert len(fleet.nodes) == 8
    first = [n for n in fleet.nodes if n.ultraserver and n.ultraserver.index == 0]
    assert [n.ultraserver.node_id_4 for n in first if n.ultraserver] == [0, 1, 2, 3]
    # Vertical pairs {0,1} and {2,3} share their 2-node server id.
    ids2 = [n.ultraserver.server_id_2 for n in first if n.ultraserver]
    assert ids2[0] == ids2[1] != ids2[2] == ids2[3]
    labels = node_labels(fleet, first[2])
    assert labels["node.kubernetes.io/instance-type"] == "trn2u.48xlarge"
    assert labels["neuron.amazonaws.com/ultraserver-node-id-4"] == "2"
    assert labels["neuron.amazonaws.com/ultraserver-node-id-2"] == "0"
    assert len(labels["neuron.amazonaws.com/ultraserver-server-id-4"]) == 16
    assert labels["topology.k8s.aws/capacity-block-id"].startswith("cr-")
    other = next(n for n in fleet.nodes if n.ultraserver and n.ultraserver.index == 1)
    assert (
        node_labels(fleet, other)["neuron.amazonaws.com/ultraserver-server-id-4"]
        != labels["neuron.amazonaws.com/ultraserver-server-id-4"]
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "nodes:\n  - instanceType: trn2.48xlarge\n    count: four\n",
            "fleet.yaml:3: nodes[0].count: expected a whole number from 1 to 1000, got 'four'",
        ),
        (
            "nodes:\n  - instanceType: trn9.huge\n",
            "fleet.yaml:2: nodes[0].instanceType: unknown instance type 'trn9.huge'",
        ),
        ("nodes:\n  - count: 2\n", "fleet.yaml:2: nodes[0]: missing field 'instanceType'"),
        ("nodez: []\n", "fleet.yaml:1: fleet: unknown field 'nodez'"),
        (
            "nodes:\n  - instanceType: trn2u.48xlarge\n",
            "fleet.yaml:2: nodes[0].instanceType: trn2u.48xlarge nodes come in UltraServers",
        ),
        (
            "ultraServers:\n  - instanceType: inf2.48xlarge\n",
            "fleet.yaml:2: ultraServers[0].instanceType: inf2.48xlarge does not come as an UltraServer",
        ),
        ("nodes: [\n", "fleet.yaml:2: not valid YAML"),
        ("", "fleet.yaml: empty fleet file"),
        (
            "nodes:\n  - instanceType: trn2.48xlarge\n    driverVersion: latest\n",
            "fleet.yaml:3: nodes[0].driverVersion: expected a version like 2.24.7.0",
        ),
        (
            "nodes:\n  - instanceType: trn2.48xlarge\n    namePrefix: a-\n  - instanceType: trn1.32xlarge\n    namePrefix: a-\n",
            "fleet.yaml:4: nodes[1]: node name 'a-0' is also made by nodes[0]",
        ),
    ],
)
def test_bad_fleet_names_line_and_field(text: str, message: str) -> None:
    with pytest.raises(FleetError) as err:
        parse_fleet(text, source="fleet.yaml")
    assert str(err.value).startswith(message)


def test_missing_fleet_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FleetError, match="cannot read the fleet file"):
        load_fleet(tmp_path / "nope.yaml")
