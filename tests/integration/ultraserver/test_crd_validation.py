"""The real apiserver refuses bad NeuronUltraServerWorkloads, naming the field.

Applied with the pinned kubectl, as a user would, against the session's local stack.
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from tests.fixtures.stack import REPO, KubeStack

pytestmark = pytest.mark.stack

CRDS = REPO / "deploy" / "kustomize" / "base" / "crds"


@pytest.fixture(scope="module")
def stack(kube_stack: KubeStack) -> KubeStack:
    kube_stack.kubectl("apply", "--server-side", "-k", str(CRDS))
    kube_stack.kubectl(
        "wait",
        "--for=condition=Established",
        "crd/neuronultraserverworkloads.neuron.aws.com",
        "crd/neuronultraservers.neuron.aws.com",
        "--timeout=60s",
    )
    return kube_stack


def workload(name: str, *, version: str = "v1beta1", **spec: Any) -> str:
    fields = {"instanceType": "trn2u.48xlarge", "topologySize": 4, "serverCount": 1, **spec}
    body = "\n".join(f"  {k}: {v}" for k, v in fields.items())
    return (
        textwrap.dedent(
            f"""\
        apiVersion: neuron.aws.com/{version}
        kind: NeuronUltraServerWorkload
        metadata:
          name: {name}
          namespace: default
        spec:
        """
        )
        + body
        + "\n"
    )


def apply(stack: KubeStack, manifest: str) -> tuple[int, str]:
    proc = stack.kubectl("apply", "-f", "-", input=manifest, check=False)
    return proc.returncode, proc.stderr


def test_topology_size_three_is_refused_naming_the_field(stack: KubeStack) -> None:
    code, err = apply(stack, workload("bad-size", topologySize=3))
    assert code != 0
    assert "spec.topologySize" in err
    assert "spec.topologySize must be one of 1, 2, 4" in err


def test_server_count_zero_is_refused_naming_the_field(stack: KubeStack) -> None:
    code, err = apply(stack, workload("bad-count", serverCount=0))
    assert code != 0
    assert "spec.serverCount: Invalid value" in err
    assert "spec.serverCount must be at least 1" in err


def test_unknown_failure_strategy_is_refused_naming_the_field(stack: KubeStack) -> None:
    code, err = apply(
        stack, workload("bad-strategy", allocationPolicy="{failureStrategy: Sometimes}")
    )
    assert code != 0
    assert "spec.allocationPolicy.failureStrategy" in err
    assert "Sometimes" in err


def test_missing_required_field_is_named(stack: KubeStack) -> None:
    manifest = workload("no-count").replace("  serverCount: 1\n", "")
    code, err = apply(stack, manifest)
    assert code != 0
    assert "spec.serverCount" in err


def test_guide_workload_applies_in_both_versions_with_defaults(stack: KubeStack) -> None:
    for version in ("v1beta1", "v1"):
        name = f"ok-{version}"
        code, err = apply(stack, workload(name, version=version, serverCount=2))
        assert code == 0, err
        obj = stack.get_json(f"neuronultraserverworkloads.{version}.neuron.aws.com", name)
        assert obj["spec"]["allocationPolicy"]["failureStrategy"] == "NoOp"
        assert obj["spec"]["config"]["logicalNeuronCore"] == 2
        stack.kubectl("delete", "nusw", name, "--wait=false")


def test_both_spellings_of_the_replace_strategy_are_accepted(stack: KubeStack) -> None:
    for strategy in ("ReplaceAffected", "MigrateAffected"):
        name = f"strategy-{strategy.lower()}"
        code, err = apply(
            stack, workload(name, allocationPolicy=f"{{failureStrategy: {strategy}}}")
        )
        assert code == 0, err
        stack.kubectl("delete", "nusw", name, "--wait=false")


def test_instance_type_is_immutable(stack: KubeStack) -> None:
    code, err = apply(stack, workload("immutable"))
    assert code == 0, err
    code, err = apply(stack, workload("immutable", instanceType="trn3.48xlarge"))
    assert code != 0
    assert "spec.instanceType is immutable" in err
    stack.kubectl("delete", "nusw", "immutable", "--wait=false")


def test_printer_columns(stack: KubeStack) -> None:
    code, err = apply(stack, workload("columns", topologySize=2, serverCount=3))
    assert code == 0, err
    # The stack's operator gives the workload a state (this small fleet has no UltraServer,
    # so it stays Pending); the row then shows it beside the spec's size and servers.
    state = stack.wait_for(
        "the workload's state",
        lambda: stack.get_json("nusw", "columns").get("status", {}).get("state"),
    )
    header, row = stack.kubectl("get", "nusw", "columns").stdout.splitlines()[:2]
    assert header.split() == ["NAME", "STATE", "SIZE", "SERVERS", "NODES", "AGE"]
    assert row.split()[:4] == ["columns", state, "2", "3"]
    stack.kubectl("delete", "nusw", "columns", "--wait=false")
