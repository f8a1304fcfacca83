"""UltraServer class files: ids, node ids, supported modes and a running election."""

from pathlib import Path

import pytest
from neuron_dra_common.hardware.model import NodeHardware
from neuron_dra_common.hardware.node import read_node
from neuron_dra_common.hardware.simulate import SimUltraServer, ultraserver_members, write_node


def _read(root: Path, sim_command: tuple[str, ...]) -> NodeHardware:
    return read_node(root, neuron_ls_command=sim_command)


def test_four_members_share_server_id_4_and_pair_vertically(tmp_path: Path) -> None:
    members = ultraserver_members(index=0, seed=7)
    read = []
    for node_id, member in enumerate(members):
        sim = write_node(
            tmp_path / str(node_id),
            instance_type="trn2u.48xlarge",
            node_name=f"us0-{node_id}",
            ultraserver=member,
        )
        hw = _read(sim.root, sim.neuron_ls_command)
        assert hw.problems == ()
        assert hw.ultraserver is not None
        read.append(hw.ultraserver)
    assert len({us.server_id_4 for us in read}) == 1
    assert [us.node_id_4 for us in read] == [0, 1, 2, 3]
    assert [us.node_id_2 for us in read] == [0, 1, 0, 1]
    assert read[0].server_id_2 == read[1].server_id_2 != read[2].server_id_2 == read[3].server_id_2
    assert all(us.supported_modes == (1, 2, 3, 4) for us in read)
    assert not any(us.election_busy for us in read)
    assert all(len(us.server_id_4 or "") == 16 for us in read)


def test_other_ultraservers_get_other_ids() -> None:
    assert (
        ultraserver_members(index=0)[0].server_id_4 != ultraserver_members(index=1)[0].server_id_4
    )


def test_node_in_no_ultraserver_reads_minus_one(tmp_path: Path) -> None:
    sim = write_node(tmp_path, instance_type="trn2u.48xlarge", node_name="n")
    assert (tmp_path / "sys/class/neuron_device/node_id_4").read_text() == "-1\n"
    us = _read(tmp_path, sim.neuron_ls_command).ultraserver
    assert us is not None
    assert (us.node_id_2, us.node_id_4) == (-1, -1)
    assert (us.server_id_2, us.server_id_4) == (None, None)
    assert not us.election_busy
    assert us.supported_modes == (4,)


def test_busy_election_is_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sim = write_node(
        tmp_path,
        instance_type="trn2u.48xlarge",
        node_name="n",
        ultraserver=SimUltraServer(election_busy=True, node_id_4=2, supported_modes=(1, 2, 3, 4)),
    )
    assert (tmp_path / "sys/class/neuron_device/node_id_4").read_text() == "busy\n"
    hw = _read(tmp_path, sim.neuron_ls_command)
    assert hw.ultraserver is not None
    assert hw.ultraserver.election_busy
    assert hw.ultraserver.node_id_4 is None
    assert hw.ultraserver.server_id_4 is None
    assert any(p.path.endswith("node_id_4") and "busy" in p.reason for p in hw.problems)
    assert not any(p.fatal for p in hw.problems)
    assert len(hw.devices) == 16
    assert any(getattr(r, "path", "").endswith("node_id_4") for r in caplog.records)


def test_all_zero_server_id_with_a_node_id_is_an_election(tmp_path: Path) -> None:
    member = ultraserver_members(index=0)[2]
    sim = write_node(
        tmp_path,
        instance_type="trn2u.48xlarge",
        node_name="n",
        ultraserver=member,
        garbage={"sys/class/neuron_device/server_id_4": "0000000000000000\n"},
    )
    us = _read(tmp_path, sim.neuron_ls_command).ultraserver
    assert us is not None
    assert us.election_busy
    assert us.server_id_4 is None
    assert us.node_id_4 == 2
    assert us.server_id_2 == member.server_id_2


def test_malformed_server_id_is_left_out(tmp_path: Path) -> None:
    sim = write_node(
        tmp_path,
        instance_type="trn2u.48xlarge",
        node_name="n",
        ultraserver=ultraserver_members(index=0)[0],
        garbage={"sys/class/neuron_device/server_id_2": "xyz\n"},
    )
    hw = _read(tmp_path, sim.neuron_ls_command)
    assert hw.ultraserver is not None
    assert hw.ultraserver.server_id_2 is None
    assert any(p.path.endswith("server_id_2") and "'xyz'" in p.reason for p in hw.problems)


def test_trn3_reservation_and_node_id(tmp_path: Path) -> None:
    member = ultraserver_members(index=3)[1]
    sim = write_node(tmp_path, instance_type="Trn3pds", node_name="n", ultraserver=member)
    hw = _read(tmp_path, sim.neuron_ls_command)
    assert hw.problems == ()
    assert hw.instance_type == "Trn3pds"
    assert hw.ultraserver is not None
    assert hw.ultraserver.reservation_id == member.reservation_id
    assert hw.ultraserver.node_id == 1
    assert hw.ultraserver.server_id_4 is None


def test_ultraserver_on_a_plain_instance_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"trn2\.48xlarge is not an UltraServer node"):
        write_node(
            tmp_path, instance_type="trn2.48xlarge", node_name="n", ultraserver=SimUltraServer()
        )


def test_trn3_busy_election(tmp_path: Path) -> None:
    sim = write_node(
        tmp_path,
        instance_type="trn3.48xlarge",
        node_name="n",
        ultraserver=SimUltraServer(election_busy=True, reservation_id="ab" * 8, node_id=3),
    )
    hw = _read(tmp_path, sim.neuron_ls_command)
    assert hw.ultraserver is not None
    assert hw.ultraserver.election_busy
    assert hw.ultraserver.node_id is None
    assert hw.ultraserver.reservation_id == "ab" * 8
    assert [p.path.endswith("node_id") for p in hw.problems] == [True]
