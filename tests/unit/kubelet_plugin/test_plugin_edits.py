"""Container edits: device nodes, visible cores per LNC, UltraServer variables."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from neuron_dra_common.topology import instance_spec
from neuron_dra_kubelet_plugin.edits import (
    EditsError,
    UltraServerPlacement,
    claim_edits,
    format_ranges,
    lnc_in_force,
    ultraserver_env,
    ultraserver_mode_enum,
)

TRN2 = instance_spec("trn2.48xlarge")


def env_of(edits_env: tuple[str, ...]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in edits_env)


def test_guide_1x4_at_default_lnc() -> None:
    edits = claim_edits(
        TRN2, [0, 1, 2, 3], lnc=lnc_in_force(TRN2, requested=None, node_default=None)
    )
    assert env_of(edits.env) == {
        "NEURON_RT_VISIBLE_CORES": "0-15",
        "NEURON_LOGICAL_NC_CONFIG": "2",
    }
    assert [n.path for n in edits.device_nodes.values()] == [f"/dev/neuron{i}" for i in range(4)]


def test_lnc1_doubles_the_cores_per_device() -> None:
    edits = claim_edits(TRN2, [1, 3], lnc=1)
    assert env_of(edits.env) == {
        "NEURON_RT_VISIBLE_CORES": "8-15,24-31",
        "NEURON_LOGICAL_NC_CONFIG": "1",
    }


def test_non_adjacent_devices_give_ranges() -> None:
    assert env_of(claim_edits(TRN2, [3, 1], lnc=2).env)["NEURON_RT_VISIBLE_CORES"] == "4-7,12-15"


def test_inf2_has_no_lnc_variable() -> None:
    inf2 = instance_spec("inf2.48xlarge")
    edits = claim_edits(inf2, [5], lnc=lnc_in_force(inf2, requested=None, node_default=None))
    assert env_of(edits.env) == {"NEURON_RT_VISIBLE_CORES": "10-11"}


def test_lnc_on_an_instance_without_it_is_refused() -> None:
    with pytest.raises(EditsError, match=r"inf2\.48xlarge has no logical NeuronCore setting"):
        lnc_in_force(instance_spec("inf2.48xlarge"), requested=2, node_default=None)


def test_claim_lnc_beats_node_default() -> None:
    assert lnc_in_force(TRN2, requested=2, node_default=1) == 2
    assert lnc_in_force(TRN2, requested=None, node_default=1) == 1


def test_host_path_under_another_dev_root() -> None:
    node = claim_edits(TRN2, [7], lnc=2, dev_root=Path("/sim/n1/dev")).device_nodes[7]
    assert (node.path, node.host_path) == ("/dev/neuron7", "/sim/n1/dev/neuron7")


@given(st.sets(st.integers(0, 15), min_size=1), st.sampled_from([1, 2]))
def test_visible_cores_are_exactly_the_devices_cores(devices: set[int], lnc: int) -> None:
    per = 8 // lnc
    text = env_of(claim_edits(TRN2, sorted(devices), lnc=lnc).env)["NEURON_RT_VISIBLE_CORES"]
    cores: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cores.update(range(int(lo), int(hi or lo) + 1))
    assert cores == {c for d in devices for c in range(d * per, d * per + per)}


def test_format_ranges() -> None:
    assert format_ranges([]) == ""
    assert format_ranges([5]) == "5"
    assert format_ranges([1, 2, 4]) == "1-2,4"


@pytest.mark.parametrize(
    ("nodes", "supported", "mode"),
    [(4, (1, 3, 4), 1), (1, (1, 3, 4), 4), (2, (1, 3, 4), 3), (2, (2, 4), 2), (2, (), 3)],
)
def test_mode_enum(nodes: int, supported: tuple[int, ...], mode: int) -> None:
    assert ultraserver_mode_enum(nodes, supported) == mode


def test_two_nodes_without_any_pairing_is_refused() -> None:
    with pytest.raises(EditsError, match="2 nodes are not available"):
        ultraserver_mode_enum(2, (4,))


def test_ultraserver_env() -> None:
    placement = UltraServerPlacement(
        nodes=4, server_id="0123456789abcdef", node_id=2, topo_id=6, topo0_host="node-a"
    )
    assert env_of(ultraserver_env(placement, supported_modes=(1, 3, 4))) == {
        "NEURON_RT_ULTRASERVER_MODE": "1",
        "NEURON_RT_ULTRASERVER_SERVER_ID": "0123456789abcdef",
        "NEURON_RT_ULTRASERVER_NODE_ID": "2",
        "NEURON_GLOBAL_TOPOID": "6",
        "NEURON_GLOBAL_TOPOID0_HOST": "node-a",
    }
