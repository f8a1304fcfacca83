"""``neuron-dra dev fault``: which processes make up a node, and refusals that name the problem."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from neuron_dra_cli.fault_cmd import LOST, apply_fault, node_processes
from neuron_dra_cli.main import main
from neuron_dra_cli.stack import process, state
from neuron_dra_common.hardware.simulate import write_node


def _component(name: str, kind: str) -> state.ComponentState:
    return state.ComponentState(name=name, kind=kind, pid=1, start_ticks=1, log="x")


def _stack(tmp_path: Path) -> Path:
    current = state.StackState(
        k8s_version="1.36.3",
        fleet="f",
        kubeconfig="k",
        apiserver="a",
        nats_url="n",
        components=(
            _component("nats", "nats"),
            _component("node-trn2-48xl-0", "node"),
            _component("node-trn2-48xl-01", "node"),
            _component("discovery-trn2-48xl-0", "discovery"),
            _component("kubelet-plugin-trn2-48xl-0", "kubelet-plugin"),
            _component("health-probe-trn2-48xl-0", "health-probe"),
            _component("slice-publisher", "slice-publisher"),
        ),
    )
    state.save(tmp_path, current)
    return tmp_path


def test_a_lost_node_is_its_kubelet_and_its_agents_only(tmp_path: Path) -> None:
    current = state.load(_stack(tmp_path))
    assert current is not None
    assert [c.name for c in node_processes(current, "trn2-48xl-0")] == [
        "node-trn2-48xl-0",
        "discovery-trn2-48xl-0",
        "kubelet-plugin-trn2-48xl-0",
        "health-probe-trn2-48xl-0",
    ]


def test_unknown_node_and_device_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _stack(tmp_path)
    assert main(["dev", "fault", "nope", "sram", "--state-dir", str(root)]) != 0
    assert "node 'nope' is not a node of the stack" in capsys.readouterr().err
    write_node(root / "nodes" / "trn2-48xl-0" / "hw", instance_type="trn2.48xlarge", node_name="x")
    args = ["dev", "fault", "trn2-48xl-0", "hbm", "--device", "16", "--state-dir", str(root)]
    assert main(args) != 0
    assert "device 16 does not exist (trn2.48xlarge has 16 devices, 0-15)" in (
        capsys.readouterr().err
    )
    args = ["dev", "fault", "trn2-48xl-0", "hbm", "--device", "15", "--state-dir", str(root)]
    assert main(args) == 0
    assert "neuron15 mem_ecc_uncorrected total 0 -> 1" in capsys.readouterr().out


def _gone(proc: process.Running, *, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while process.alive(proc):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# The stack lets go of the processes it starts; Python reports such a handle when collected.
@pytest.mark.filterwarnings("ignore:subprocess .* is still running:ResourceWarning")
def test_a_lost_node_is_killed_once_and_only_it(tmp_path: Path) -> None:
    started = {
        name: process.start(["sleep", "60"], log_path=tmp_path / "logs" / f"{name}.log")
        for name in ("node-trn2-48xl-0", "discovery-trn2-48xl-0", "node-trn2-48xl-1")
    }
    try:
        current = state.StackState(
            k8s_version="1.36.3",
            fleet="f",
            kubeconfig="k",
            apiserver="a",
            nats_url="n",
            components=tuple(
                state.ComponentState(
                    name=name, kind="node", pid=r.pid, start_ticks=r.start_ticks, log="x"
                )
                for name, r in started.items()
            ),
        )
        state.save(tmp_path, current)
        [said] = apply_fault(tmp_path, node="trn2-48xl-0", fault=LOST)
        assert said.startswith("killed node-trn2-48xl-0 (pid ")
        assert "discovery-trn2-48xl-0" in said
        assert _gone(started["node-trn2-48xl-0"])
        assert _gone(started["discovery-trn2-48xl-0"])
        assert process.alive(started["node-trn2-48xl-1"])
        assert apply_fault(tmp_path, node="trn2-48xl-0", fault=LOST) == [
            "killed nothing (already down)"
        ]
    finally:
        process.stop(list(started.values()), timeout=2)
