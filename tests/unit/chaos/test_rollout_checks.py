"""What the rollout phase (R4) calls converged: the node's checkpoint and CDI specs hold
exactly the claims of its running pods; and how its results read."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from neuron_dra_common import cdi
from neuron_dra_kubelet_plugin.checkpoint import CheckpointStore
from neuron_dra_kubelet_plugin.faults import STEPS
from neuron_dra_kubelet_plugin.preparer import Effects, NodePreparer
from neuron_dra_kubelet_plugin.registration import socket_paths

from chaos.driver import Outcome
from chaos.rollout import StepResult, node_problems
from tests.unit.kubelet_plugin.support import MemoryClaims, make_claim, ref_of, trn2_node

UID = "7c1d0e6a-1111-4a2b-8c3d-000000000001"


class Cluster:
    """What ``kubectl get`` would list: pods and claims of the namespace."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        raise AssertionError("node_problems only reads")

    def items(self, *args: str) -> list[dict[str, Any]] | None:
        if args[0] == "pods":
            return self.pods
        return [{"metadata": {"name": "p-neurons", "uid": UID}}]


def _pod(node: str, phase: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "p"},
        "spec": {"nodeName": node},
        "status": {"phase": phase, "resourceClaimStatuses": [{"resourceClaimName": "p-neurons"}]},
    }


def _prepared(root: Path) -> dict[str, str]:
    """A node whose plugin prepared claim ``UID``; the plugin's environment for it."""
    kubelet = root / "kubelet"
    claim = make_claim(UID, [0, 1, 2, 3], name="p-neurons")
    store = CheckpointStore(socket_paths(kubelet).dra.parent / "checkpoint.json")
    preparer = NodePreparer(
        node=trn2_node(),
        claims=MemoryClaims([claim]),
        effects=Effects(store=store, cdi_root=root / "cdi"),
        boot_id="boot",
    )
    preparer.recover()
    asyncio.run(preparer.prepare(ref_of(claim)))
    return {"NEURON_DRA_KUBELET_ROOT": str(kubelet), "NEURON_DRA_CDI_ROOT": str(root / "cdi")}


def test_a_running_pods_claim_prepared_once_is_converged(tmp_path: Path) -> None:
    env = _prepared(tmp_path)
    assert node_problems(Cluster([_pod("n1", "Running")]), "chaos", "n1", env) == []


def test_a_claim_prepared_for_no_running_pod_is_not(tmp_path: Path) -> None:
    env = _prepared(tmp_path)
    for pods in ([], [_pod("n1", "Pending")], [_pod("n2", "Running")]):
        assert node_problems(Cluster(pods), "chaos", "n1", env) == [
            f"checkpoint holds ['{UID}'], running pods []"
        ]


def test_a_claim_without_its_cdi_spec_is_not(tmp_path: Path) -> None:
    env = _prepared(tmp_path)
    cdi.remove_claim_spec(tmp_path / "cdi", UID)
    assert node_problems(Cluster([_pod("n1", "Running")]), "chaos", "n1", env) == [
        f"CDI specs [], checkpoint ['{UID}']"
    ]


def test_r4_is_met_only_when_every_step_converged() -> None:
    every = [StepResult(step, "n1", 2.0 + i) for i, step in enumerate(STEPS)]
    done = Outcome(seed=1, seconds=60, converged_seconds=1.0, rollout=every)
    assert done.goals()["R4"] == f"met (slowest {1.0 + len(STEPS):.1f} s)"
    assert done.ok
    some = Outcome(seed=1, seconds=60, converged_seconds=1.0, rollout=every[:3])
    assert some.goals()["R4"] == f"met for 3 of {len(STEPS)} steps (slowest 4.0 s)"
    stuck = [*every[:-1], every[-1]._replace(problem="timed out")]
    failed = Outcome(seed=1, seconds=60, converged_seconds=1.0, rollout=stuck)
    assert failed.goals()["R4"] == "NOT MET"
    assert not failed.ok
    bystander = Outcome(
        seed=1, seconds=60, converged_seconds=1.0, rollout=every, rollout_problems=["x"]
    )
    assert not bystander.ok
    assert Outcome(seed=1, seconds=60).goals()["R4"] == "not measured: no --rollout"
