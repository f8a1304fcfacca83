"""AWS's `efa-neurons-4-devices`: four connected Neuron devices and the four EFA interfaces
wired to them, in one claim, placed by the real kube-scheduler (its `matchAttribute` on
`resource.aws.com/devicegroup4_id` across the two drivers) and prepared through the real
kubelet by the Neuron plugin and the simulated EFA driver."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest
from neuron_dra_common.efa import EFA_DEVICE_CLASS, EFA_DRIVER_NAME, efa_interfaces
from neuron_dra_common.topology import device_attributes

from tests.e2e.actuate.support import Actuate
from tests.fixtures.stack import REPO, neuron_dra

pytestmark = pytest.mark.stack

EXAMPLE = REPO / "examples" / "efa" / "efa-neurons-4-devices.yaml"
GROUP4 = "resource.aws.com/devicegroup4_id"


def _slice_devices(actuate: Actuate, node: str, driver: str) -> dict[str, Any]:
    slices = actuate.stack.get_json("resourceslices")["items"]
    return {
        d["name"]: d
        for s in slices
        if s["spec"]["driver"] == driver and s["spec"].get("nodeName") == node
        for d in s["spec"]["devices"]
    }


def test_efa_driver_publishes_aligned_interfaces_per_trn2_node(actuate: Actuate) -> None:
    assert actuate.stack.get_json("deviceclass", EFA_DEVICE_CLASS)["metadata"]["name"]
    for node in actuate.trn2_nodes():
        efas: dict[str, Any] = actuate.stack.wait_for(
            f"the dra.net ResourceSlice of {node}",
            functools.partial(_slice_devices, actuate, node, EFA_DRIVER_NAME),
        )
        # AWS's figure for trn2.48xlarge: 16 EFA interfaces, one per Neuron device.
        assert len(efas) == 16
        for iface in efa_interfaces("trn2.48xlarge"):
            attrs = efas[iface.name]["attributes"]
            assert iface.neuron_device is not None  # trn2's EFA map is published
            want = device_attributes("trn2.48xlarge", iface.neuron_device)
            for size in (1, 4, 8, 16):
                key = f"resource.aws.com/devicegroup{size}_id"
                assert attrs[key]["string"] == want[key]
            assert attrs["pciDevice"]["string"] == "Elastic Fabric Adapter (EFA)"
    # Nothing on the inf2 node: AWS publishes no EFA map for it.
    inf2 = [n.name for n in actuate.fleet.nodes if n.instance_type == "inf2.48xlarge"]
    assert inf2
    assert not _slice_devices(actuate, inf2[0], EFA_DRIVER_NAME)


def test_one_claim_gets_four_neurons_and_their_four_efas(actuate: Actuate) -> None:
    stack = actuate.stack
    try:
        stack.kubectl("apply", "-f", str(EXAMPLE))
        pod = actuate.wait_running("efa-pod0", timeout=120)
        node = pod["spec"]["nodeName"]
        claim = actuate.claim_of("efa-pod0")
        results = claim["status"]["allocation"]["devices"]["results"]
        neurons = [r for r in results if r["request"] == "4-neurons"]
        efas = [r for r in results if r["request"] == "4-efas"]
        assert {r["driver"] for r in neurons} == {"neuron.aws.com"}
        assert {r["driver"] for r in efas} == {EFA_DRIVER_NAME}
        assert len(neurons) == 4
        assert len(efas) == 4
        assert {r["pool"] for r in results} == {node}
        # Aligned: every device of the claim, of either driver, in one devicegroup4.
        neuron_devices = _slice_devices(actuate, node, "neuron.aws.com")
        efa_devices = _slice_devices(actuate, node, EFA_DRIVER_NAME)
        groups = {neuron_devices[r["device"]]["attributes"][GROUP4]["string"] for r in neurons} | {
            efa_devices[r["device"]]["attributes"][GROUP4]["string"] for r in efas
        }
        assert len(groups) == 1, groups
        wired = {
            i.name: i.neuron_device
            for i in efa_interfaces("trn2.48xlarge")
            if i.neuron_device is not None
        }
        indices = sorted(int(r["device"].removeprefix("neurondevice")) for r in neurons)
        assert sorted(wired[r["device"]] for r in efas) == indices

        # What the container sees: the Neuron plugin's devices and runtime variables, and
        # the EFA driver's uverbs device nodes, each under its own CDI kind.
        shown = neuron_dra(
            "dev", "env", "efa-pod0", "--state-dir", str(stack.state_dir), "-o", "json"
        )
        assert shown.returncode == 0, shown.stdout + shown.stderr
        [container] = json.loads(shown.stdout)["containers"]
        uid = claim["metadata"]["uid"]
        assert sorted(container["cdiDevices"]) == sorted(
            [f"neuron.aws.com/neuron={uid}-neurondevice{i}" for i in indices]
            + [f"dra.net/efa={uid}-{r['device']}" for r in efas]
        )
        paths = {d["path"] for d in container["deviceNodes"]}
        assert {f"/dev/neuron{i}" for i in indices} <= paths
        uverbs = {i.name: i.uverbs for i in efa_interfaces("trn2.48xlarge")}
        assert {f"/dev/infiniband/{uverbs[r['device']]}" for r in efas} <= paths
        assert container["env"]["NEURON_LOGICAL_NC_CONFIG"] == "2"
        assert "NEURON_RT_VISIBLE_CORES" in container["env"]
    finally:
        actuate.delete_pod("efa-pod0", timeout=120)
        stack.kubectl("delete", "-f", str(EXAMPLE), "--ignore-not-found", "--wait=false")
    # Unprepared by both plugins once the pod is gone.
    spec_dir = actuate.layout.node_dir(node) / "cdi"
    stack.wait_for(
        "both CDI specs of the claim removed",
        lambda: not [p for p in spec_dir.iterdir() if uid in p.name],
    )
