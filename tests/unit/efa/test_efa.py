"""The EFA interfaces the simulated EFA driver publishes, the claims it prepares, and the
operator's EFAReady condition (pure logic; the stack runs them in tests/e2e/efa)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from neuron_dra_common import cdi
from neuron_dra_common.efa import EFA_CDI_KIND, efa_interfaces, slice_devices
from neuron_dra_common.topology import catalog_instance_types, device_attributes, instance_spec
from neuron_dra_kubelet_plugin.claims import ClaimRef, ResourceClaim, claim_from_api
from neuron_dra_kubelet_plugin.efasim import EfaPreparer, SimNode, load_nodes
from neuron_dra_kubelet_plugin.plan import PrepareError
from neuron_dra_ultraserver_operator.efa import efa_condition
from neuron_dra_ultraserver_operator.model import workload_from_api


@pytest.mark.parametrize("instance", ["trn2.48xlarge", "trn2u.48xlarge"])
def test_every_interface_carries_the_group_ids_of_its_neuron_device(instance: str) -> None:
    devices = slice_devices(instance)
    assert len(devices) == 16  # AWS: vpc.amazonaws.com/efa: 16 on trn2.48xlarge
    for iface, device in zip(efa_interfaces(instance), devices, strict=True):
        assert iface.neuron_device is not None
        want = device_attributes(instance, iface.neuron_device)
        for size in (1, 4, 8, 16):
            key = f"resource.aws.com/devicegroup{size}_id"
            assert device["attributes"][key] == {"string": want[key]}  # type: ignore[index]


def test_every_instance_with_efa_has_its_count_and_only_a_map_aligns_them() -> None:
    for name in catalog_instance_types():
        spec = instance_spec(name)
        interfaces = efa_interfaces(name)
        if spec.efa_map is None:
            assert len(interfaces) == spec.efa_count, name
        else:
            assert len(interfaces) == len(set(spec.efa_map)), name
        names = [i.name for i in interfaces]
        assert len(set(names)) == len(names), name
        aligned = [
            d for d in slice_devices(name)
            if "resource.aws.com/devicegroup1_id" in d["attributes"]  # type: ignore[operator]
        ]  # fmt: skip
        assert len(aligned) == (len(interfaces) if spec.efa_map is not None else 0), name


def test_trn3_has_sixteen_interfaces_without_group_ids() -> None:
    # AWS publishes 16 EFA for Trn3 but no Neuron-to-EFA map: all 16, none aligned.
    assert len(efa_interfaces("trn3pds.48xlarge")) == 16
    assert [i.uverbs for i in efa_interfaces("trn3.48xlarge")][-1] == "uverbs15"


def test_four_aligned_interfaces_share_one_group4_id_per_torus_row() -> None:
    by_group: dict[str, list[int | None]] = {}
    for iface, device in zip(
        efa_interfaces("trn2.48xlarge"), slice_devices("trn2.48xlarge"), strict=True
    ):
        group = device["attributes"]["resource.aws.com/devicegroup4_id"]["string"]  # type: ignore[index]
        by_group.setdefault(group, []).append(iface.neuron_device)
    assert sorted(by_group.values()) == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 10, 11],
        [12, 13, 14, 15],
    ]


class _Claims:
    def __init__(self, claim: ResourceClaim | None) -> None:
        self.claim = claim

    async def get(self, ref: ClaimRef) -> ResourceClaim | None:
        return self.claim


def _claim(uid: str, results: list[dict[str, str]]) -> ResourceClaim:
    return claim_from_api(
        {
            "metadata": {"name": "c", "namespace": "default", "uid": uid},
            "status": {"allocation": {"devices": {"results": results}}},
        }
    )


def _node(tmp_path: Path) -> SimNode:
    return SimNode(
        name="n1", instance_type="trn2.48xlarge", kubelet_root=str(tmp_path / "k"),
        cdi_root=str(tmp_path / "cdi"), dev_root="/hw/dev",
    )  # fmt: skip


def test_prepare_writes_the_interfaces_uverbs_and_unprepare_removes_them(tmp_path: Path) -> None:
    ref = ClaimRef(namespace="default", name="c", uid="u1")
    claim = _claim(
        "u1",
        [
            {"request": "4-efas", "driver": "dra.net", "pool": "n1", "device": "pci-0000-b4-00-0"},
            {
                "request": "4-neurons",
                "driver": "neuron.aws.com",
                "pool": "n1",
                "device": "neurondevice1",
            },
        ],
    )
    preparer = EfaPreparer(_node(tmp_path), claims=_Claims(claim))
    [device] = asyncio.run(preparer.prepare(ref))
    assert device.cdi_device_ids == ("dra.net/efa=u1-pci-0000-b4-00-0",)
    assert device.request_names == ("4-efas",)
    spec = cdi.read_claim_spec(tmp_path / "cdi", "u1", EFA_CDI_KIND)
    assert spec is not None
    [node] = spec.devices[0].container_edits.device_nodes
    assert (node.path, node.host_path) == ("/dev/infiniband/uverbs1", "/hw/dev/infiniband/uverbs1")
    assert asyncio.run(preparer.prepare(ref)) == (device,)  # idempotent
    asyncio.run(preparer.unprepare(ref))
    asyncio.run(preparer.unprepare(ref))
    assert cdi.read_claim_spec(tmp_path / "cdi", "u1", EFA_CDI_KIND) is None


def test_prepare_refuses_an_interface_of_another_node(tmp_path: Path) -> None:
    claim = _claim(
        "u2", [{"request": "efa", "driver": "dra.net", "pool": "n2", "device": "pci-0000-b4-00-0"}]
    )
    preparer = EfaPreparer(_node(tmp_path), claims=_Claims(claim))
    with pytest.raises(PrepareError, match="not an EFA interface of node n1"):
        asyncio.run(preparer.prepare(ClaimRef(namespace="default", name="c", uid="u2")))


def test_efa_condition_names_the_field_and_the_device_class() -> None:
    wl = workload_from_api(
        {
            "metadata": {"name": "w", "namespace": "d", "generation": 3},
            "spec": {"instanceType": "trn2u.48xlarge", "topologySize": 4, "serverCount": 2},
        }
    )
    cond = efa_condition(wl, installed=False, now="2026-01-01T00:00:00Z")
    assert cond["status"] == "False"
    assert "spec.serverCount 2" in cond["message"]
    assert "efa.networking.k8s.aws" in cond["message"]
    assert efa_condition(wl, installed=True, now="2026-01-01T00:00:00Z")["status"] == "True"


def test_a_nodes_file_with_an_unknown_instance_type_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "nodes.json"
    path.write_text(
        '[{"name": "a", "instanceType": "trn9.1xlarge", "kubeletRoot": "/k", '
        '"cdiRoot": "/c", "devRoot": "/d"}]'
    )
    with pytest.raises(ValueError, match=r"\$\[0\]\.instanceType: instance type 'trn9.1xlarge'"):
        load_nodes(path)
