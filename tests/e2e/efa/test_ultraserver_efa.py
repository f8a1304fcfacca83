"""AWS's UltraServer operator guide for a workload of two UltraServers: EFA is required, the
guide's `efa-claim-template` is attached beside the operator's Neuron template, and each of
the eight pods gets all 16 EFA interfaces of its node. Without the EFA driver (no DeviceClass)
the workload says so in its `EFAReady` condition and an Event, and says again when it comes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from neuron_dra_common.efa import EFA_DEVICE_CLASS, EFA_DRIVER_NAME, device_class

from tests.e2e.ultraserver.converged import wait_state
from tests.fixtures.stack import REPO, KubeStack, neuron_dra

pytestmark = pytest.mark.stack

EXAMPLES = REPO / "examples"


def _condition(stack: KubeStack, name: str) -> dict[str, Any] | None:
    status = stack.get_json("nusw", name).get("status") or {}
    return next((c for c in status.get("conditions") or () if c["type"] == "EFAReady"), None)


def test_two_ultraserver_workload_pods_get_every_efa_of_their_node(us_stack: KubeStack) -> None:
    guide_with_efa(us_stack, EXAMPLES / "ultraserver" / "workload.yaml")


def guide_with_efa(stack: KubeStack, workload: Path) -> None:
    stack.kubectl("apply", "-f", str(workload))
    try:
        status = wait_state(stack, "my-training-job", "Allocated")
        nodes = {n["nodeName"] for a in status["allocations"] for n in a["nodes"]}
        assert len(nodes) == 8
        ready = stack.wait_for(
            "EFAReady True", lambda: (c := _condition(stack, "my-training-job")) and c
        )
        assert ready["status"] == "True"
        assert ready["reason"] == "EFADriverInstalled"
        # The decider's own conditions are still there beside it.
        shown = {
            c["type"] for c in stack.get_json("nusw", "my-training-job")["status"]["conditions"]
        }
        assert {"Allocated", "Ready", "EFAReady"} <= shown

        stack.kubectl("apply", "-f", str(EXAMPLES / "efa" / "efa-claim-template.yaml"))
        stack.kubectl("apply", "-f", str(EXAMPLES / "efa" / "ultraserver-deployment.yaml"))

        def running() -> list[dict[str, Any]]:
            pods = stack.get_json("pods", "-l", "app=ultraserver-training")["items"]
            ok = [p for p in pods if p["status"].get("phase") == "Running"]
            return ok if len(ok) == 8 else []

        pods = stack.wait_for("8 Running pods", running, timeout=240)
        assert {p["spec"]["nodeName"] for p in pods} == nodes
        for pod in pods:
            node = pod["spec"]["nodeName"]
            names = {
                s["name"]: s["resourceClaimName"] for s in pod["status"]["resourceClaimStatuses"]
            }
            efa = stack.get_json("resourceclaim", names["efa-claim"])
            results = efa["status"]["allocation"]["devices"]["results"]
            # allocationMode: All takes every EFA interface of the node: 16 on trn2u and Trn3.
            assert len(results) == 16
            assert {(r["driver"], r["pool"]) for r in results} == {(EFA_DRIVER_NAME, node)}
        shown_env = neuron_dra(
            "dev", "env", pods[0]["metadata"]["name"], "--state-dir", str(stack.state_dir),
            "-o", "json",
        )  # fmt: skip
        assert shown_env.returncode == 0, shown_env.stdout + shown_env.stderr
        [container] = json.loads(shown_env.stdout)["containers"]
        paths = {d["path"] for d in container["deviceNodes"]}
        assert {f"/dev/infiniband/uverbs{i}" for i in range(16)} <= paths
        assert {f"/dev/neuron{i}" for i in range(16)} <= paths
        assert container["env"]["NEURON_RT_ULTRASERVER_MODE"] == "1"
        assert sum(1 for c in container["cdiDevices"] if c.startswith("dra.net/efa=")) == 16
    finally:
        stack.kubectl(
            "delete", "-f", str(EXAMPLES / "efa" / "ultraserver-deployment.yaml"),
            "--ignore-not-found", "--timeout=180s",
        )  # fmt: skip
        stack.kubectl("delete", "nusw", "my-training-job", "--ignore-not-found", "--timeout=120s")


def test_without_the_efa_driver_the_workload_says_so(us_stack: KubeStack) -> None:
    stack = us_stack
    stack.kubectl("delete", "deviceclass", EFA_DEVICE_CLASS)
    try:
        stack.kubectl("apply", "-f", str(EXAMPLES / "ultraserver" / "workload.yaml"))
        missing = stack.wait_for(
            "EFAReady False",
            lambda: (c := _condition(stack, "my-training-job")) and c["status"] == "False" and c,
        )
        assert missing["reason"] == "EFADriverNotInstalled"
        assert "spec.serverCount 2" in missing["message"]
        assert EFA_DEVICE_CLASS in missing["message"]
        events = stack.wait_for(
            "the EFADriverNotInstalled Event",
            lambda: [
                e
                for e in stack.get_json(
                    "events", "--field-selector", "reason=EFADriverNotInstalled"
                )["items"]
                if e["involvedObject"]["name"] == "my-training-job"
            ],
        )
        assert events[0]["type"] == "Warning"
        # AWS's driver installed afterwards: the workload says so without being touched.
        stack.kubectl("apply", "-f", "-", input=json.dumps(device_class()))
        back = stack.wait_for(
            "EFAReady True again",
            lambda: (c := _condition(stack, "my-training-job")) and c["status"] == "True" and c,
            timeout=60,
        )
        assert back["reason"] == "EFADriverInstalled"
    finally:
        stack.kubectl("apply", "-f", "-", input=json.dumps(device_class()))
        stack.kubectl("delete", "nusw", "my-training-job", "--ignore-not-found", "--timeout=120s")
