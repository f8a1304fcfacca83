"""AWS supports its Neuron DRA driver on no node whose kubelet is 1.34.0 or 1.34.1 (a DRA
regression, kubernetes#133920, fixed in 1.34.2). On the stack, node old-kubelet-0 runs the
kubelet code of 1.34.1 (built from the official k8s.io/kubernetes v1.34.1 module), which reports
its own version: the kubelet plugin says so (log, a Warning Event on the Node, the NeuronHealth
condition, which the health probe leaves alone) and refuses its claims with a reason
``kubectl describe pod`` shows; the setting serves them anyway; a node on 1.34.4 serves as
before.

The tests run in this order on one stack: the last one restarts the old node's plugin with the
setting.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from neuron_dra_cli import kubebuild

from tests.e2e.actuate.pods import claim_pod
from tests.e2e.actuate.support import Actuate
from tests.fixtures.stack import REPO

pytestmark = [pytest.mark.stack, pytest.mark.floor]

OLD = "old-kubelet-0"
FIXED = "trn2-48xl-0"
EXAMPLE_POD = REPO / "examples" / "kubelet-check" / "pod.yaml"
SETTING = "NEURON_DRA_ALLOW_KUBELET_DRA_REGRESSION"


def kubelet_version(kcheck: Actuate, node: str) -> str:
    version: str = kcheck.stack.get_json("node", node)["status"]["nodeInfo"]["kubeletVersion"]
    return version


def conditions(kcheck: Actuate, node: str) -> dict[str, dict[str, Any]]:
    items = kcheck.stack.get_json("node", node)["status"].get("conditions") or []
    return {c["type"]: c for c in items}


def node_events(kcheck: Actuate, node: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kcheck.stack.get_json(
        "events",
        "-n",
        "default",
        "--field-selector",
        f"involvedObject.kind=Node,involvedObject.name={node},reason=KubeletDRARegression",
    )["items"]
    return items


def own_kubeconfig(kcheck: Actuate) -> Path:
    """The old node's plugin's kubeconfig from `dev up`: a token bound to a pod on its node,
    which the admission policy neuron-dra-kubelet-plugin-nodes asks for."""
    return kcheck.layout.component_kubeconfig(f"kubelet-plugin-{OLD}")


def patch_condition(
    kubeconfig: Path, node: str, condition: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    """As the kubelet plugin writes NeuronHealth, with the token ``kubeconfig`` names: a
    strategic merge patch of nodes/status; the API server's status and answer."""
    config = json.loads(kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    token = Path(config["users"][0]["user"]["tokenFile"]).read_text().strip()
    request = urllib.request.Request(
        f"{cluster['server']}/api/v1/nodes/{node}/status",
        data=json.dumps({"status": {"conditions": [condition]}}).encode(),
        method="PATCH",
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/strategic-merge-patch+json",
        },
    )
    tls = ssl.create_default_context(cafile=cluster["certificate-authority"])
    try:
        with urllib.request.urlopen(request, context=tls, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def prepare_failures(kcheck: Actuate, pod: str) -> list[str]:
    """The plugin's Warning Events on ``pod`` (the simulated kubelet records no Events of its
    own, only logs its ``FailedPrepareDynamicResources``)."""
    return [
        e["message"]
        for e in kcheck.events_for(pod)
        if e["reason"] == "FailedPrepare" and e["type"] == "Warning"
    ]


# The first test starts the stack, which builds the 1.34.1 node when it is not cached yet.
@pytest.mark.timeout(1800)
def test_a_kubelet_with_the_regression_is_warned_about_and_refused(kcheck: Actuate) -> None:
    stack = kcheck.stack
    # Real kubelets, reporting the release they were built from.
    assert kubelet_version(kcheck, OLD) == "v1.34.1"
    assert kubelet_version(kcheck, FIXED) == f"v{kubebuild.FLOOR_VERSION}"

    (event,) = stack.wait_for(
        f"the Warning Event on Node {OLD}", lambda: node_events(kcheck, OLD), timeout=90
    )
    assert event["type"] == "Warning"
    assert event["source"]["component"] == "neuron-dra-kubelet-plugin"
    for part in ("kubelet v1.34.1", "kubernetes#133920", "v1.34.2", SETTING):
        assert part in event["message"], event["message"]

    # The health probe has written this node's conditions (AcceleratedHardwareReady is its
    # alone), and left the plugin's NeuronHealth as it is.
    stack.wait_for(
        f"the health probe's conditions on {OLD}",
        lambda: "AcceleratedHardwareReady" in conditions(kcheck, OLD),
        timeout=90,
    )
    health = stack.wait_for(
        f"NeuronHealth KubeletDRARegression on {OLD}",
        lambda: (
            (c := conditions(kcheck, OLD).get("NeuronHealth", {})).get("reason")
            == "KubeletDRARegression"
            and c
        ),
        timeout=90,
    )
    assert health["status"] == "True"
    assert "kubernetes#133920" in health["message"]
    described = stack.kubectl("describe", "node", OLD).stdout
    assert "KubeletDRARegression" in described
    log = kcheck.log(OLD).read_text()
    assert "kubelet has a DRA regression: claims are refused on this node" in log

    # A pod's claim there fails with the reason, where `kubectl describe pod` shows it.
    stack.kubectl("apply", "-f", str(EXAMPLE_POD))
    (failure,) = stack.wait_for(
        "the Warning Event FailedPrepare on the pod",
        lambda: prepare_failures(kcheck, "on-old-kubelet"),
        timeout=90,
    )
    print(f"\nkubectl describe pod on-old-kubelet: Warning FailedPrepare {failure}")
    for part in (f"node {OLD}", "kubelet v1.34.1", "kubernetes#133920", "v1.34.2", SETTING):
        assert part in failure, failure
    assert "kubernetes#133920" in stack.kubectl("describe", "pod", "on-old-kubelet").stdout
    # The kubelet 1.34.1 itself got that error back from NodePrepareResources.
    kubelet_log = kcheck.layout.log(f"node-{OLD}").read_text()
    assert "NodePrepareResources failed for ResourceClaim" in kubelet_log
    assert "kubernetes#133920" in kubelet_log
    assert kcheck.pod("on-old-kubelet")["status"].get("phase") == "Pending"
    assert kcheck.cdi_specs(OLD) == {}  # nothing was prepared


def test_a_kubelet_on_a_fixed_release_serves_as_before(kcheck: Actuate) -> None:
    kcheck.apply(claim_pod("on-fixed-kubelet", node=FIXED, count=1))
    kcheck.wait_running("on-fixed-kubelet", timeout=120)
    assert len(kcheck.cdi_specs(FIXED)) == 1
    assert node_events(kcheck, FIXED) == []
    assert conditions(kcheck, FIXED)["NeuronHealth"]["reason"] == "NeuronHasNoError"
    assert "kubelet has a DRA regression" not in kcheck.log(FIXED).read_text()
    kcheck.delete_pod("on-fixed-kubelet")


def test_the_setting_serves_a_kubelet_with_the_regression_and_keeps_warning(
    kcheck: Actuate,
) -> None:
    stack = kcheck.stack
    kcheck.kill_plugin(OLD)
    kcheck.start_plugin(
        OLD, env={SETTING: "true", "NEURON_DRA_KUBECONFIG": str(own_kubeconfig(kcheck))}
    )
    kcheck.wait_plugin_ready(OLD)
    # The waiting pod's claim is prepared at the kubelet's next try.
    kcheck.wait_running("on-old-kubelet", timeout=120)
    assert len(kcheck.cdi_specs(OLD)) == 1
    anyway = stack.wait_for(
        "the Event saying claims are prepared anyway",
        lambda: [e for e in node_events(kcheck, OLD) if "prepared anyway" in e["message"]],
        timeout=60,
    )
    assert anyway[0]["type"] == "Warning"
    health = conditions(kcheck, OLD)["NeuronHealth"]
    assert (health["status"], health["reason"]) == ("True", "KubeletDRARegression")
    assert "prepared anyway" in health["message"]
    assert "claims are prepared anyway, as the setting allows" in kcheck.log(OLD).read_text()
    stack.kubectl("delete", "-f", str(EXAMPLE_POD), "--wait=false")
    stack.wait_for("the claim unprepared", lambda: kcheck.cdi_specs(OLD) == {}, timeout=90)


def test_the_kubelet_plugin_may_write_only_its_own_nodes_neuron_health(kcheck: Actuate) -> None:
    """RBAC lets the plugin's ServiceAccount patch any Node's status; the admission policy
    keeps a plugin to the NeuronHealth condition of the node its pod-bound token names."""
    own = own_kubeconfig(kcheck)
    current = conditions(kcheck, OLD)["NeuronHealth"]
    same = {k: current[k] for k in ("type", "status", "reason", "message")}
    status, answer = patch_condition(own, OLD, same)
    assert status == 200, answer
    forged = {**same, "reason": "Forged"}
    status, answer = patch_condition(own, FIXED, forged)
    assert status == 403
    assert f"may write only Node {OLD}, not Node {FIXED}" in answer["message"]
    ready = {"type": "Ready", "status": "False", "reason": "Forged", "message": "test"}
    status, answer = patch_condition(own, OLD, ready)
    assert status == 403
    assert "may change only the NeuronHealth conditions" in answer["message"]
    # A token of the plugin's account bound to no pod names no node.
    status, answer = patch_condition(kcheck.plugin_kubeconfig, OLD, forged)
    assert status == 403
    assert "this token names no node" in answer["message"]
    assert conditions(kcheck, OLD)["NeuronHealth"]["reason"] == "KubeletDRARegression"
    assert conditions(kcheck, FIXED)["NeuronHealth"]["reason"] == "NeuronHasNoError"
