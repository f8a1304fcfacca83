"""No device is handed out twice: rows fill a node, a fifth waits for a free row, many pods
over many nodes never share a device, and an UltraServer's node device excludes its chips."""

from __future__ import annotations

import pytest

from tests.e2e.describe.support import (
    allocation,
    bound,
    chips,
    create,
    example,
    pod,
    unschedulable_reason,
)
from tests.fixtures.stack import KubeStack, neuron_dra

pytestmark = pytest.mark.stack

ROWS = [chips(*range(r * 4, r * 4 + 4)) for r in range(4)]
NODE = "trn2-48xl-1"


def test_four_rows_fill_a_node_and_a_fifth_waits_for_one(
    describe_stack: KubeStack, ns: str
) -> None:
    describe_stack.kubectl(
        "apply", "-n", ns, "-f", str(example("v1", "1x4-connected-devices.yaml"))
    )
    describe_stack.kubectl("delete", "pod", "pod0", "-n", ns, "--force", "--grace-period=0")
    create(
        describe_stack, ns, *(pod(f"row{i}", "1x4-connected-neurons", node=NODE) for i in range(4))
    )
    rows = []
    for i in range(4):
        assert bound(describe_stack, ns, f"row{i}") == NODE
        rows.append(allocation(describe_stack, ns, f"row{i}")[1])
    assert sorted(rows) == sorted(ROWS)
    shown = neuron_dra("topology", "show", NODE, "--kubeconfig", str(describe_stack.kubeconfig))
    assert shown.returncode == 0, shown.stderr
    assert "(16 devices, 16 held)" in shown.stdout
    assert len({line.split()[0] for line in shown.stdout.splitlines() if f"{ns}/" in line}) == 4

    create(describe_stack, ns, pod("fifth", "1x4-connected-neurons", node=NODE))
    assert "cannot allocate all claims" in unschedulable_reason(describe_stack, ns, "fifth")
    describe_stack.kubectl("delete", "pod", "row2", "-n", ns, "--force", "--grace-period=0")
    assert bound(describe_stack, ns, "fifth", timeout=90) == NODE
    assert allocation(describe_stack, ns, "fifth")[1] == rows[2]


def test_no_device_is_allocated_twice_across_pods_and_nodes(
    describe_stack: KubeStack, ns: str
) -> None:
    describe_stack.kubectl(
        "apply", "-n", ns, "-f", str(example("v1", "1x4-connected-devices.yaml"))
    )
    describe_stack.kubectl("apply", "-n", ns, "-f", str(example("v1", "l-trn2.yaml")))
    pods = [pod(f"four-{i}", "1x4-connected-neurons") for i in range(6)]
    pods += [pod(f"eight-{i}", "l-trn2") for i in range(4)]
    create(describe_stack, ns, *pods)
    # 3 trn2 nodes hold 48 devices; 4 + 6 x 4 + 4 x 8 = 60 are asked: some must wait.

    def decided() -> bool:
        items = describe_stack.get_json("pods", "-n", ns)["items"]
        return len(items) == 11 and all(
            p["spec"].get("nodeName")
            or any(
                c.get("reason") == "Unschedulable"
                for c in p.get("status", {}).get("conditions", [])
            )
            for p in items
        )

    describe_stack.wait_for("the scheduler to decide every pod", decided, timeout=120)
    seen: dict[tuple[str, str], str] = {}
    for p in describe_stack.get_json("pods", "-n", ns)["items"]:
        name = p["metadata"]["name"]
        if not p["spec"].get("nodeName"):
            continue
        pools, devices = allocation(describe_stack, ns, name)
        [pool] = pools
        assert pool == p["spec"]["nodeName"]
        for device in devices:
            assert (pool, device) not in seen, (
                f"{pool}/{device}: {seen.get((pool, device))} and {name}"
            )
            seen[(pool, device)] = name
    assert 0 < len(seen) <= 48, f"{len(seen)} trn2 devices allocated"


def test_ultraserver_node_device_and_chips_exclude_each_other(
    describe_stack: KubeStack, ns: str
) -> None:
    describe_stack.kubectl("apply", "-n", ns, "-f", str(example("v1", "us-4-node-config.yaml")))
    chip_rct = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-trn2u-chip"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "neurons",
                            "exactly": {
                                "deviceClassName": "neuron.aws.com",
                                "selectors": [
                                    {
                                        "cel": {
                                            "expression": "device.attributes['neuron.aws.com']"
                                            ".instanceType == 'trn2u.48xlarge'"
                                        }
                                    }
                                ],
                            },
                        }
                    ]
                }
            }
        },
    }
    create(describe_stack, ns, chip_rct)
    # Node device first, then a chip on the same node: the chip waits.
    create(describe_stack, ns, pod("whole", "us-4-node-config", node="us0-trn2u-48xl-0"))
    assert bound(describe_stack, ns, "whole") == "us0-trn2u-48xl-0"
    assert allocation(describe_stack, ns, "whole")[1] == ["neuronnode"]
    create(describe_stack, ns, pod("chip", "one-trn2u-chip", node="us0-trn2u-48xl-0"))
    assert "cannot allocate all claims" in unschedulable_reason(describe_stack, ns, "chip")
    # A chip first, then the node device on that node: the node device waits.
    create(describe_stack, ns, pod("chip1", "one-trn2u-chip", node="us0-trn2u-48xl-1"))
    assert bound(describe_stack, ns, "chip1") == "us0-trn2u-48xl-1"
    assert allocation(describe_stack, ns, "chip1")[1] == ["neurondevice0"]
    create(describe_stack, ns, pod("whole1", "us-4-node-config", node="us0-trn2u-48xl-1"))
    assert "cannot allocate all claims" in unschedulable_reason(describe_stack, ns, "whole1")


def test_all_chips_on_an_ultraserver_node_never_include_the_node_device(
    describe_stack: KubeStack, ns: str
) -> None:
    rct = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "all-trn2u-chips"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "neurons",
                            "exactly": {
                                "deviceClassName": "neuron.aws.com",
                                "allocationMode": "All",
                                "selectors": [
                                    {
                                        "cel": {
                                            "expression": "device.attributes['neuron.aws.com']"
                                            ".instanceType == 'trn2u.48xlarge'"
                                        }
                                    }
                                ],
                            },
                        }
                    ]
                }
            }
        },
    }
    create(describe_stack, ns, rct, pod("all", "all-trn2u-chips", node="us0-trn2u-48xl-2"))
    assert bound(describe_stack, ns, "all") == "us0-trn2u-48xl-2"
    assert allocation(describe_stack, ns, "all")[1] == chips(*range(16))
