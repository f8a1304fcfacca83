"""AWS's Neuron UltraServer operator guide on Trn3 UltraServers, the hardware it is written
for: its workload with ``<trn3pds instance type>`` filled in, through kubectl, down to what
each container sees, checked against what each node's driver shows in sysfs."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_cli.stack.services import hardware_root

from tests.e2e.ultraserver.converged import pod_env, wait_state
from tests.fixtures.stack import REPO, KubeStack

pytestmark = pytest.mark.stack

EXAMPLES = REPO / "examples" / "ultraserver"
NS = "neuron-dra-driver"
INSTANCE = "trn3pds.48xlarge"
GIB = 1024**3


def driver_file(stack: KubeStack, node: str, name: str) -> str:
    """A class-level file of the node's Neuron driver (``reservation_id``, ``node_id``...)."""
    root = hardware_root(Layout(stack.state_dir), node)
    return (root / "sys" / "class" / "neuron_device" / name).read_text().strip()


def test_trn3_ultraservers_are_discovered_as_their_driver_shows_them(trn3_stack: KubeStack) -> None:
    stack = trn3_stack
    nodes = stack.get_json("nodes", "-l", f"node.kubernetes.io/instance-type={INSTANCE}")
    assert len(nodes["items"]) == 8
    # The guide's "List discovered UltraServers".
    listed = stack.kubectl("get", "neuronultraservers", "-n", NS).stdout
    assert listed.count(INSTANCE) == 2, listed
    for nus in stack.get_json("neuronultraservers", "-n", NS)["items"]:
        assert nus["spec"]["instanceType"] == INSTANCE
        assert nus["status"]["availableConfigurations"] == [1, 2, 4]
        members = {t["nodeName"]: t["nodeId"] for t in nus["spec"]["topology"]}
        assert sorted(members.values()) == [0, 1, 2, 3]
        for node, node_id in members.items():
            # Trn3's driver names the UltraServer by reservation_id and the node by node_id.
            assert driver_file(stack, node, "reservation_id") == nus["spec"]["serverId"]
            assert driver_file(stack, node, "node_id") == str(node_id)
            assert driver_file(stack, node, "ultraserver_mode") == "1,2,3,4"
            assert not (
                hardware_root(Layout(stack.state_dir), node) / "sys/class/neuron_device/server_id_4"
            ).exists()

    # Every node: 16 Trainium3 devices of 144 GiB and 4 logical cores (8 physical, LNC 2),
    # and the whole-node device the operator's claims take.
    for s in stack.get_json("resourceslices")["items"]:
        devices = {d["name"]: d for d in s["spec"].get("devices") or ()}
        if not devices:
            continue
        chips = [d for n, d in devices.items() if n.startswith("neurondevice")]
        assert len(chips) == 16, s["spec"]["nodeName"]
        for chip in chips:
            assert chip["attributes"]["instanceType"] == {"string": INSTANCE}
            assert chip["capacity"]["memory"]["value"] == str(144 * GIB)
            assert chip["capacity"]["neuronCores"]["value"] == "4"
        node = devices["neuronnode"]
        assert node["attributes"]["ultraserverModes"] == {"string": "1,2,3,4"}
        assert node["capacity"]["neuronCores"]["value"] == "64"


def test_the_operator_guide_runs_on_trn3_ultraservers(trn3_stack: KubeStack) -> None:
    stack = trn3_stack
    text = (EXAMPLES / "trn3-workload.yaml").read_text()
    assert f"instanceType: {INSTANCE} # UltraServer instance type" in text
    stack.kubectl("apply", "-f", str(EXAMPLES / "trn3-workload.yaml"))
    status = wait_state(stack, "my-training-job", "Allocated")
    assert status["totalNodesAllocated"] == 8
    assert len(status["allocatedUltraServers"]) == 2
    assert {a["mode"] for a in status["allocations"]} == {1}  # the driver's 4-node mode
    nodes = {n["nodeName"] for a in status["allocations"] for n in a["nodes"]}
    assert len(nodes) == 8
    # The guide's "Check allocation status" and "Inspect a specific UltraServer".
    shown = stack.get_json("neuronultraserverworkload", "my-training-job")["status"]
    assert shown["allocatedUltraServers"] == status["allocatedUltraServers"]
    for name in status["allocatedUltraServers"]:
        nus = stack.get_json("neuronultraserver", name, "-n", NS)
        assert nus["status"]["state"] == "FullyAllocated"
        assert nus["status"]["allocations"][0]["workloadRef"] == "default/my-training-job"

    stack.kubectl("apply", "-f", str(EXAMPLES / "deployment.yaml"))

    def running() -> list[dict[str, Any]]:
        pods = stack.get_json("pods", "-l", "app=ultraserver-training")["items"]
        ok = [p for p in pods if p["status"].get("phase") == "Running"]
        return ok if len(ok) == 8 else []

    pods = stack.wait_for("8 Running pods", running, timeout=180)
    assert {p["spec"]["nodeName"] for p in pods} == nodes
    ranks = []
    for pod in pods:
        node = pod["spec"]["nodeName"]
        env = pod_env(stack, pod["metadata"]["name"])
        # Trn3's ids, as the node's driver shows them, and its 4-node mode enum.
        assert env["NEURON_RT_ULTRASERVER_MODE"] == "1"
        assert env["NEURON_RT_ULTRASERVER_SERVER_ID"] == driver_file(stack, node, "reservation_id")
        assert env["NEURON_RT_ULTRASERVER_NODE_ID"] == driver_file(stack, node, "node_id")
        # The whole node: 16 devices x 4 logical cores at Trn3's default LNC 2.
        assert env["NEURON_LOGICAL_NC_CONFIG"] == "2"
        assert env["NEURON_RT_VISIBLE_CORES"] == "0-63"
        ranks.append(int(env["NEURON_GLOBAL_TOPOID"]))
        assert env["NEURON_GLOBAL_TOPOID0_HOST"] == status["topology0Host"]
    assert sorted(ranks) == list(range(8))

    # The guide's cleanup: the cascade takes the template and releases the UltraServers.
    stack.kubectl("delete", "neuronultraserverworkload", "my-training-job", "--timeout=120s")
    assert (
        stack.kubectl(
            "get", "resourceclaimtemplates", "my-training-job-rct", check=False
        ).returncode
        != 0
    )
    stack.kubectl("delete", "deployment", "my-training-workload-deployment", "--timeout=60s")
    for name in status["allocatedUltraServers"]:

        def available(n: str = name) -> bool:
            return bool(stack.get_json("nus", "-n", NS, n)["status"]["state"] == "Available")

        stack.wait_for(f"{name} Available", available, timeout=60)


@pytest.mark.parametrize("name", ["Trn3pds", "trn3.48xlarge"])
def test_a_workload_may_name_trn3_by_its_other_names(trn3_stack: KubeStack, name: str) -> None:
    stack = trn3_stack
    manifest = textwrap.dedent(
        f"""\
        apiVersion: neuron.aws.com/v1beta1
        kind: NeuronUltraServerWorkload
        metadata:
          name: other-name
        spec:
          instanceType: {name}
          topologySize: 2
          serverCount: 1
        """
    )
    stack.kubectl("apply", "-f", "-", input=manifest)
    status = wait_state(stack, "other-name", "Allocated")
    assert status["totalNodesAllocated"] == 2
    assert {a["mode"] for a in status["allocations"]} == {3}  # a vertical pair
    stack.kubectl("delete", "neuronultraserverworkload", "other-name", "--timeout=120s")
