"""A Neuron monitor DaemonSet whose claims have admin access (examples/monitoring/): one pod
per Neuron node, each seeing every device of its node while a job holds some of them, taking
nothing from anyone; refused by the API server in a namespace not labelled for it."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from neuron_dra_common.topology import instance_spec

from tests.e2e.actuate.pods import claim_pod
from tests.e2e.actuate.support import Actuate
from tests.e2e.admin.support import EXAMPLES, container_views, device_paths
from tests.fixtures.stack import neuron_dra

pytestmark = pytest.mark.stack

MONITOR = EXAMPLES / "monitoring" / "neuron-monitor.yaml"
NS = "neuron-monitor"
NODE = "trn2-48xl-0"

# Verbatim from the API server; the field path is its own (it names neither ``spec.spec`` nor
# ``exactly``).
REFUSED = (
    'The ResourceClaimTemplate "all-neurons-admin" is invalid: '
    "spec.devices.requests[0].adminAccess: Forbidden: admin access to devices "
    "requires the `resource.kubernetes.io/admin-access: true` label on the containing namespace"
)


def monitor_pods(actuate: Actuate) -> dict[str, dict[str, Any]]:
    """Node name -> the monitor's Running pod there."""
    items = actuate.stack.get_json("pods", "-n", NS, "-l", "app=neuron-monitor")["items"]
    return {
        p["spec"]["nodeName"]: p
        for p in items
        if p["status"].get("phase") == "Running" and p["spec"].get("nodeName")
    }


def claim_results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = claim["status"]["allocation"]["devices"]["results"]
    return results


def held_devices(actuate: Actuate, pod: str) -> set[str]:
    return {r["device"] for r in claim_results(actuate.claim_of(pod))}


def test_the_monitor_sees_every_device_and_takes_none(actuate: Actuate) -> None:
    stack = actuate.stack
    managed = {n.name: n for n in actuate.fleet.nodes if n.dra}
    actuate.apply(claim_pod("job", node=NODE, count=4))
    try:
        actuate.wait_running("job")
        job_claim = actuate.claim_of("job")
        job_uid = job_claim["metadata"]["uid"]
        job_held = held_devices(actuate, "job")
        job_spec = actuate.cdi_specs(NODE)[job_uid]

        stack.kubectl("apply", "-f", str(MONITOR))
        pods = stack.wait_for(
            "a Running monitor pod on every Neuron node",
            lambda: (found := monitor_pods(actuate)).keys() == managed.keys() and found,
            timeout=180,
        )
        for node, pod in pods.items():
            name = pod["metadata"]["name"]
            count = instance_spec(managed[node].instance_type).devices
            claim = actuate.claim_of(name, NS)
            results = claim_results(claim)
            # Every device of the node, the busy ones too, each with admin access.
            assert sorted(r["device"] for r in results) == sorted(
                f"neurondevice{i}" for i in range(count)
            )
            assert all(r.get("adminAccess") is True for r in results), results
            (view,) = container_views(stack, name, NS).values()
            assert device_paths(view) == [f"/dev/neuron{i}" for i in range(count)]
            entry = actuate.checkpoint(node)[claim["metadata"]["uid"]]
            assert entry["state"] == "PrepareCompleted"
            assert all(d["adminAccess"] for d in entry["devices"])
        monitor_uids = {
            node: actuate.claim_of(pod["metadata"]["name"], NS)["metadata"]["uid"]
            for node, pod in pods.items()
        }

        # The audit stream says the monitor's claim holds none of what it was prepared with.
        monitor_claim = actuate.claim_of(pods[NODE]["metadata"]["name"], NS)["metadata"]["name"]
        told = stack.wait_for(
            "the monitor's ClaimPrepared on the audit stream",
            lambda: [
                line
                for line in neuron_dra(
                    "events", "--claim", f"{NS}/{monitor_claim}", "--state-dir",
                    str(stack.state_dir), timeout=60,
                ).stdout.splitlines()
                if "prepared on" in line
            ],
        )  # fmt: skip
        count = instance_spec(managed[NODE].instance_type).devices
        assert f"(admin access to {count}, holding none of them)" in told[0], told

        # The job kept its devices and runs on; a new job still gets devices the monitor sees.
        assert actuate.pod("job")["status"]["phase"] == "Running"
        assert actuate.cdi_specs(NODE)[job_uid] == job_spec
        actuate.apply(claim_pod("second-job", node=NODE, count=4))
        actuate.wait_running("second-job")
        second_held = held_devices(actuate, "second-job")
        assert len(second_held) == 4
        assert second_held.isdisjoint(job_held)

        # topology show names the jobs as holders, never the monitor.
        shown = neuron_dra("topology", "show", NODE, "--kubeconfig", str(stack.kubeconfig))
        assert shown.returncode == 0, shown.stderr
        assert "default/job" in shown.stdout
        assert "default/second-job" in shown.stdout
        assert NS not in shown.stdout
        assert "8 held" in shown.stdout

        # The monitor goes away; the jobs' devices stay prepared for them.
        stack.kubectl("delete", "daemonset", "neuron-monitor", "-n", NS)
        stack.wait_for(
            "the monitor's claims unprepared on every node",
            lambda: (
                not any(
                    uid in actuate.cdi_specs(node) or uid in actuate.checkpoint(node)
                    for node, uid in monitor_uids.items()
                )
            ),
            timeout=120,
        )
        assert actuate.cdi_specs(NODE)[job_uid] == job_spec
        assert actuate.checkpoint(NODE)[job_uid]["state"] == "PrepareCompleted"
        assert actuate.pod("job")["status"]["phase"] == "Running"
    finally:
        stack.kubectl("delete", "-f", str(MONITOR), "--ignore-not-found", "--wait=false")
        for pod in ("job", "second-job"):
            actuate.delete_pod(pod)
            stack.kubectl("delete", "resourceclaimtemplate", pod, "--ignore-not-found")


def test_admin_access_is_refused_in_a_namespace_not_labelled_for_it(actuate: Actuate) -> None:
    stack = actuate.stack
    template = next(
        d for d in yaml.safe_load_all(MONITOR.read_text()) if d["kind"] == "ResourceClaimTemplate"
    )
    template["metadata"]["namespace"] = "no-admin"
    stack.create_namespace("no-admin")
    try:
        proc = stack.kubectl("apply", "-f", "-", input=json.dumps(template), check=False)
        assert proc.returncode == 1
        assert proc.stderr.strip() == REFUSED
        # The label is the whole reason: with it the same template is accepted.
        stack.kubectl("label", "namespace", "no-admin", "resource.kubernetes.io/admin-access=true")
        stack.kubectl("apply", "-f", "-", input=json.dumps(template))
    finally:
        stack.kubectl("delete", "namespace", "no-admin", "--wait=false")
