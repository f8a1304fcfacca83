"""The templates of AWS's Neuron DRA driver guide, verbatim (v1beta1) and in v1 form, on the
real kube-scheduler with the pools discovery and the slice publisher wrote for simulated trn2 nodes.

Pods do not run here (no kubelet plugin on these nodes); what is checked is what the
scheduler decides: the claim's allocation and the pod's node.
"""

from __future__ import annotations

import pytest

from tests.e2e.describe.support import (
    VERSIONS,
    allocation,
    bound,
    chips,
    create,
    example,
    pod,
    unschedulable_reason,
)
from tests.fixtures.stack import KubeStack

pytestmark = pytest.mark.stack

ROWS = [chips(*range(r * 4, r * 4 + 4)) for r in range(4)]
PAIRS = [chips(*range(0, 8)), chips(*range(8, 16))]


@pytest.mark.parametrize("version", VERSIONS)
def test_1x4_template_gives_one_torus_row(describe_stack: KubeStack, ns: str, version: str) -> None:
    applied = describe_stack.kubectl(
        "apply", "-n", ns, "-f", str(example(version, "1x4-connected-devices.yaml"))
    )
    assert "resourceclaimtemplate.resource.k8s.io/1x4-connected-neurons created" in applied.stdout
    node = bound(describe_stack, ns, "pod0")
    pools, devices = allocation(describe_stack, ns, "pod0")
    assert pools == {node}
    assert devices in ROWS


@pytest.mark.parametrize("version", VERSIONS)
def test_8_device_template_gives_two_adjacent_rows(
    describe_stack: KubeStack, ns: str, version: str
) -> None:
    describe_stack.kubectl("apply", "-n", ns, "-f", str(example(version, "l-trn2.yaml")))
    create(describe_stack, ns, pod("large", "l-trn2"))
    node = bound(describe_stack, ns, "large")
    pools, devices = allocation(describe_stack, ns, "large")
    assert pools == {node}
    assert devices in PAIRS


@pytest.mark.parametrize("version", VERSIONS)
def test_16_device_template_gives_the_whole_trn2(
    describe_stack: KubeStack, ns: str, version: str
) -> None:
    describe_stack.kubectl("apply", "-n", ns, "-f", str(example(version, "xl-trn2.yaml")))
    create(describe_stack, ns, pod("xl", "xl-trn2"))
    node = bound(describe_stack, ns, "xl")
    pools, devices = allocation(describe_stack, ns, "xl")
    assert pools == {node}
    assert devices == chips(*range(16))


@pytest.mark.parametrize("version", VERSIONS)
def test_driver_version_template_only_matches_that_driver(
    describe_stack: KubeStack, ns: str, version: str
) -> None:
    describe_stack.kubectl("apply", "-n", ns, "-f", str(example(version, "2.26-driver-trn2.yaml")))
    create(
        describe_stack,
        ns,
        pod("old-driver", "2.26-driver-trn2"),
        pod("pinned-new-driver", "2.26-driver-trn2", node="trn2-newdrv-0"),
    )
    assert bound(describe_stack, ns, "old-driver").startswith("trn2-48xl-")
    message = unschedulable_reason(describe_stack, ns, "pinned-new-driver")
    assert "cannot allocate all claims" in message, message
    assert not describe_stack.get_json("pod", "pinned-new-driver", "-n", ns)["spec"].get("nodeName")


@pytest.mark.parametrize("version", VERSIONS)
def test_allocation_mode_all_takes_the_whole_node(
    describe_stack: KubeStack, ns: str, version: str
) -> None:
    describe_stack.kubectl("apply", "-n", ns, "-f", str(example(version, "lnc-setting-trn2.yaml")))
    node = bound(describe_stack, ns, "pod0")
    pools, devices = allocation(describe_stack, ns, "pod0")
    assert pools == {node}
    assert devices == chips(*range(16))


@pytest.mark.parametrize("version", VERSIONS)
def test_lnc_template_in_its_own_namespace_applies(describe_stack: KubeStack, version: str) -> None:
    describe_stack.kubectl("create", "namespace", "neuron-test7", check=False)
    out = describe_stack.kubectl("apply", "-f", str(example(version, "lnc-neurons.yaml")))
    assert "lnc-neurons" in out.stdout
    describe_stack.kubectl("delete", "-f", str(example(version, "lnc-neurons.yaml")))
