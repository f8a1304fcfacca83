"""The admission policies that keep each neuron-dra writer to its own objects and fields
(deploy/kustomize/base/policies), against the stack's real API server.

Two Nodes without a kubelet, A and B, and pods bound to them (``spec.nodeName``) stand for a
cluster; each identity writes with a token the TokenRequest API issues for its
ServiceAccount, bound to a pod on its node as the kubelet binds a pod's projected token (it
carries the node's name, ``authentication.kubernetes.io/node-name``). Every refusal is the API
server's 403 naming the policy's reason, and the object read back afterwards is unchanged.
"""

from __future__ import annotations

import json
import ssl
import textwrap
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from neuron_dra_common.kube import ApiException, connect
from neuron_dra_health_monitor.detector_kube import NodeNotes
from neuron_dra_health_monitor.probe_node import ConditionWriter

from tests.fixtures.stack import REPO, KubeStack

pytestmark = pytest.mark.stack

NS = "neuron-dra-driver"
PROBE = "neuron-dra-health-probe"
DEVICE_PLUGIN = "neuron-dra-device-plugin"
DETECTOR = "neuron-dra-failure-detector"
PUBLISHER = "neuron-dra-slice-publisher"
DEVICE_PLUGIN_RBAC = REPO / "deploy" / "kustomize" / "components" / "device-plugin" / "rbac.yaml"

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
FLAPPING = {"key": "neuron.aws.com/unstable", "value": "flapping", "effect": "NoSchedule"}


@dataclass
class Api:
    """Requests to the stack's API server with a bearer token, as the services send them."""

    server: str
    ca: str

    def call(
        self, token: str, method: str, path: str, body: Any = None, *, kind: str = ""
    ) -> tuple[int, Any]:
        """``kind`` is the body's type: a merge patch for PATCH unless told, else JSON."""
        kind = kind or (MERGE if method == "PATCH" else "application/json")
        request = urllib.request.Request(
            self.server + path,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"Authorization": f"Bearer {token}", "Content-Type": kind},
        )
        tls = ssl.create_default_context(cafile=self.ca)
        try:
            with urllib.request.urlopen(request, context=tls, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


@dataclass
class World:
    api: Api
    stack: KubeStack
    node_a: str
    node_b: str
    #: Workload pods (in ``namespace``) bound to A and B, waiting for the device plugin.
    namespace: str
    pod_a: str
    pod_b: str
    #: Tokens: each node agent's bound to its pod on A (``probe_b``: on B), the others' plain.
    probe_a: str
    probe_b: str
    probe_unbound: str
    probe_elsewhere: str
    plugin_a: str
    detector: str
    publisher: str

    def node(self, name: str) -> dict[str, Any]:
        return dict(self.stack.get_json("node", name))

    def pod(self, name: str) -> dict[str, Any]:
        return dict(self.stack.get_json("pod", name, "-n", self.namespace))


def _pod(name: str, namespace: str, node: str, account: str, annotations: dict[str, str]) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "nodeName": node,
            "serviceAccountName": account,
            "automountServiceAccountToken": False,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": "registry.invalid/none"}],
        },
    }


def _token(stack: KubeStack, account: str, namespace: str = NS, pod: str = "") -> str:
    """A token of ``account`` from the TokenRequest API, bound to ``pod`` when given."""
    bound = ["--bound-object-kind=Pod", f"--bound-object-name={pod}"] if pod else []
    return stack.kubectl("create", "token", account, "-n", namespace, *bound).stdout.strip()


@pytest.fixture(scope="module")
def world(kube_stack: KubeStack) -> Iterator[World]:
    stack = kube_stack
    suffix = uuid.uuid4().hex[:6]
    node_a, node_b = f"policy-a-{suffix}", f"policy-b-{suffix}"
    namespace, elsewhere = f"policy-work-{suffix}", f"policy-other-{suffix}"
    stack.kubectl("apply", "-f", str(DEVICE_PLUGIN_RBAC))
    for node in (node_a, node_b):
        stack.kubectl(
            "apply", "-f", "-", input=json.dumps({"kind": "Node", "apiVersion": "v1",
                                                  "metadata": {"name": node}}),
        )  # fmt: skip
    stack.create_namespace(namespace)
    stack.create_namespace(elsewhere)
    # Someone else's ServiceAccount of the same name, in another namespace.
    stack.kubectl("create", "serviceaccount", PROBE, "-n", elsewhere)
    agent_pods = [
        _pod(f"probe-a-{suffix}", NS, node_a, PROBE, {}),
        _pod(f"probe-b-{suffix}", NS, node_b, PROBE, {}),
        _pod(f"plugin-a-{suffix}", NS, node_a, DEVICE_PLUGIN, {}),
        _pod(f"probe-a-{suffix}", elsewhere, node_a, PROBE, {}),
        _pod("work-a", namespace, node_a, "default", {"NEURON_ALLOCATED": "false"}),
        _pod("work-b", namespace, node_b, "default", {"NEURON_ALLOCATED": "false"}),
    ]
    stack.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                              "items": agent_pods}),
    )  # fmt: skip
    config = yaml.safe_load(Path(stack.kubeconfig).read_text())["clusters"][0]["cluster"]
    world = World(
        api=Api(server=config["server"], ca=config["certificate-authority"]),
        stack=stack,
        node_a=node_a,
        node_b=node_b,
        namespace=namespace,
        pod_a="work-a",
        pod_b="work-b",
        probe_a=_token(stack, PROBE, pod=f"probe-a-{suffix}"),
        probe_b=_token(stack, PROBE, pod=f"probe-b-{suffix}"),
        probe_unbound=_token(stack, PROBE),
        probe_elsewhere=_token(stack, PROBE, elsewhere, pod=f"probe-a-{suffix}"),
        plugin_a=_token(stack, DEVICE_PLUGIN, pod=f"plugin-a-{suffix}"),
        detector=_token(stack, DETECTOR),
        publisher=_token(stack, PUBLISHER),
    )
    try:
        yield world
    finally:
        for ns in (namespace, elsewhere):
            stack.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        stack.kubectl(
            "delete", "pod", "-n", NS, f"probe-a-{suffix}", f"probe-b-{suffix}",
            f"plugin-a-{suffix}", "--wait=false", check=False,
        )  # fmt: skip
        stack.kubectl("delete", "node", node_a, node_b, "--wait=false", check=False)


def _condition(kind: str, status: str = "True", reason: str = "PolicyTest") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": "written by a test"}


def _conditions(node: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in node.get("status", {}).get("conditions") or []}


def _refused(answer: tuple[int, Any], says: str) -> None:
    status, body = answer
    assert status == 403, body
    assert says in body["message"], body["message"]


def _patch_condition(world: World, token: str, node: str, *conditions: dict[str, str]) -> Any:
    """A strategic merge patch of ``nodes/<node>/status``, as the health probe writes."""
    return world.api.call(
        token,
        "PATCH",
        f"/api/v1/nodes/{node}/status",
        {"status": {"conditions": list(conditions)}},
        kind=STRATEGIC,
    )


def test_the_health_probe_writes_its_own_nodes_conditions(world: World) -> None:
    status, body = _patch_condition(
        world,
        world.probe_a,
        world.node_a,
        _condition("NeuronHealth", "False"),
        _condition("AcceleratedHardwareReady"),
    )
    assert status == 200, body
    written = _conditions(world.node(world.node_a))
    assert written["NeuronHealth"]["status"] == "False"
    assert written["AcceleratedHardwareReady"]["reason"] == "PolicyTest"


def test_the_health_probe_of_a_node_cannot_write_another_nodes_conditions(world: World) -> None:
    answer = _patch_condition(
        world, world.probe_a, world.node_b, _condition("NeuronHealth", reason="Forged")
    )
    _refused(
        answer,
        f"the health probe of node {world.node_a} may write only Node {world.node_a}, "
        f"not Node {world.node_b}",
    )
    assert "NeuronHealth" not in _conditions(world.node(world.node_b))
    # Node B's own probe may.
    status, body = _patch_condition(world, world.probe_b, world.node_b, _condition("NeuronHealth"))
    assert status == 200, body


def test_the_health_probe_cannot_write_other_conditions_or_fields(world: World) -> None:
    node = world.node_a
    before = world.node(node)
    _refused(
        _patch_condition(world, world.probe_a, node, _condition("Ready", "False", "Forged")),
        f"may change only the NeuronHealth, AcceleratedHardwareReady conditions of Node {node}, "
        "not Ready",
    )
    # Its own condition beside another's: the whole write is refused.
    _refused(
        _patch_condition(
            world,
            world.probe_a,
            node,
            _condition("NeuronHealth", reason="Forged"),
            _condition("MemoryPressure", reason="Forged"),
        ),
        "not MemoryPressure",
    )
    path = f"/api/v1/nodes/{node}/status"
    _refused(
        world.api.call(world.probe_a, "PATCH", path, {"metadata": {"labels": {"x.io/y": "z"}}}),
        f"may not change the labels, annotations, owners or finalizers of Node {node}",
    )
    _refused(
        world.api.call(
            world.probe_a, "PATCH", path, {"status": {"capacity": {"aws.amazon.com/neuron": "64"}}}
        ),
        f"may change only conditions in the status of Node {node}",
    )
    # Nor the Node itself: RBAC gives it the status only.
    status, body = world.api.call(
        world.probe_a, "PATCH", f"/api/v1/nodes/{node}", {"metadata": {"labels": {"x.io/y": "z"}}}
    )
    assert status == 403, body
    assert 'cannot patch resource "nodes"' in body["message"], body
    after = world.node(node)
    assert all(c["reason"] != "Forged" for c in _conditions(after).values())
    assert "x.io/y" not in (after["metadata"].get("labels") or {})
    assert after["status"].get("capacity") == before["status"].get("capacity")


def test_a_health_probe_token_bound_to_no_pod_names_no_node_and_is_refused(world: World) -> None:
    answer = _patch_condition(
        world, world.probe_unbound, world.node_a, _condition("NeuronHealth", reason="Forged")
    )
    _refused(answer, "this token names no node")
    assert _conditions(world.node(world.node_a)).get("NeuronHealth", {}).get("reason") != "Forged"


def test_a_pod_in_another_namespace_cannot_write_as_the_health_probe(world: World) -> None:
    # Same ServiceAccount name, a pod on node A, in a namespace that is not the driver's.
    answer = _patch_condition(
        world, world.probe_elsewhere, world.node_a, _condition("NeuronHealth", reason="Forged")
    )
    status, body = answer
    assert status == 403, body
    assert 'cannot patch resource "nodes/status"' in body["message"], body
    assert _conditions(world.node(world.node_a)).get("NeuronHealth", {}).get("reason") != "Forged"


def _annotate(world: World, token: str, pod: str, body: Any) -> Any:
    """A merge patch of a workload pod, as the device plugin marks one served."""
    return world.api.call(token, "PATCH", f"/api/v1/namespaces/{world.namespace}/pods/{pod}", body)


def _served(value: str | None) -> dict[str, Any]:
    return {"metadata": {"annotations": {"NEURON_ALLOCATED": value}}}


def test_the_device_plugin_marks_a_pod_on_its_node_served(world: World) -> None:
    status, body = _annotate(world, world.plugin_a, world.pod_a, _served("true"))
    assert status == 200, body
    assert world.pod(world.pod_a)["metadata"]["annotations"]["NEURON_ALLOCATED"] == "true"


def test_the_device_plugin_of_a_node_cannot_write_a_pod_on_another_node(world: World) -> None:
    _refused(
        _annotate(world, world.plugin_a, world.pod_b, _served("true")),
        f"the device plugin of node {world.node_a} may write only pods bound to node "
        f"{world.node_a}, not pod {world.namespace}/{world.pod_b} (bound to node {world.node_b})",
    )
    assert world.pod(world.pod_b)["metadata"]["annotations"]["NEURON_ALLOCATED"] == "false"


def test_the_device_plugin_cannot_write_other_annotations_or_fields(world: World) -> None:
    pod = world.pod_a
    before = world.pod(pod)
    where = f"pod {world.namespace}/{pod}"
    for body, says in (
        (
            {"metadata": {"annotations": {"example.com/x": "y"}}},
            f"may change only the NEURON_ALLOCATED annotation of {where}, not example.com/x",
        ),
        (_served("maybe"), f'may only set the NEURON_ALLOCATED annotation of {where} to "true"'),
        (_served(None), "not remove it"),
        ({"metadata": {"labels": {"example.com/x": "y"}}}, "not its labels, owners, finalizers"),
        ({"spec": {"activeDeadlineSeconds": 1}}, "not its labels, owners, finalizers or spec"),
    ):
        _refused(_annotate(world, world.plugin_a, pod, body), says)
    after = world.pod(pod)
    assert after["metadata"].get("annotations") == before["metadata"].get("annotations")
    assert after["metadata"].get("labels") == before["metadata"].get("labels")
    assert after["spec"] == before["spec"]


def _taints(node: dict[str, Any]) -> list[dict[str, Any]]:
    return list(node.get("spec", {}).get("taints") or [])


def _write_taints(world: World, token: str, node: str, change: Any) -> Any:
    """Read the Node, write its taints as ``change(taints)`` returns them with the
    resourceVersion read (again on a conflict: the node controller taints kubelet-less Nodes),
    as the failure detector writes."""
    for _ in range(5):
        obj = world.node(node)
        body = {
            "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
            "spec": {"taints": change(_taints(obj))},
        }
        answer = world.api.call(token, "PATCH", f"/api/v1/nodes/{node}", body)
        if answer[0] != 409:
            return answer
    raise AssertionError(f"conflicts writing the taints of {node}")


def test_the_failure_detector_adds_and_removes_its_taint(world: World) -> None:
    node = world.node_a
    status, body = _write_taints(world, world.detector, node, lambda t: [*t, FLAPPING])
    assert status == 200, body
    assert FLAPPING in _taints(world.node(node))
    status, body = _write_taints(
        world, world.detector, node, lambda t: [x for x in t if x["key"] != FLAPPING["key"]]
    )
    assert status == 200, body
    assert all(t["key"] != FLAPPING["key"] for t in _taints(world.node(node)))


def test_the_failure_detector_cannot_write_other_node_fields(world: World) -> None:
    node = world.node_b
    foreign = {"key": "example.com/x", "effect": "NoExecute"}
    evicting = {**FLAPPING, "effect": "NoExecute"}
    _refused(
        _write_taints(world, world.detector, node, lambda t: [*t, foreign]),
        f"may add or remove only its neuron.aws.com/unstable taint on Node {node}, "
        "not example.com/x",
    )
    _refused(
        _write_taints(world, world.detector, node, lambda t: [*t, evicting]),
        "is flapping:NoSchedule only",
    )
    path = f"/api/v1/nodes/{node}"
    _refused(
        world.api.call(world.detector, "PATCH", path, {"spec": {"unschedulable": True}}),
        f"may change only its neuron.aws.com/unstable taint in the spec of Node {node}",
    )
    _refused(
        world.api.call(world.detector, "PATCH", path, {"metadata": {"labels": {"x.io/y": "z"}}}),
        f"may not change the labels, annotations, owners or finalizers of Node {node}",
    )
    # It writes no condition: RBAC gives it no status.
    status, body = _patch_condition(world, world.detector, node, _condition("Ready", "False"))
    assert status == 403, body
    after = world.node(node)
    assert all(t["key"] not in ("example.com/x", FLAPPING["key"]) for t in _taints(after))
    assert not after["spec"].get("unschedulable")
    assert "x.io/y" not in (after["metadata"].get("labels") or {})


def _slice(name: str, driver: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "dev0"}],
        },
    }


def test_the_slice_publisher_writes_neuron_slices(world: World) -> None:
    # A dry run: admission runs in full, and the stack's publisher keeps its own pools.
    status, body = world.api.call(
        world.publisher,
        "POST",
        "/apis/resource.k8s.io/v1/resourceslices?dryRun=All",
        _slice(f"{world.node_a}-neuron", "neuron.aws.com", world.node_a),
    )
    assert status == 201, body


def test_the_slice_publisher_cannot_write_another_drivers_slices(world: World) -> None:
    name = f"{world.node_a}-gpu"
    _refused(
        world.api.call(
            world.publisher,
            "POST",
            "/apis/resource.k8s.io/v1/resourceslices",
            _slice(name, "gpu.example.com", world.node_a),
        ),
        f"writes only ResourceSlices of driver neuron.aws.com, not {name} of driver "
        "gpu.example.com",
    )
    gone = world.stack.kubectl("get", "resourceslice", name, check=False)
    assert gone.returncode != 0
    assert "NotFound" in gone.stderr
    # Nor change or delete one an administrator wrote.
    world.stack.kubectl(
        "apply", "-f", "-", input=json.dumps(_slice(name, "gpu.example.com", world.node_a))
    )
    try:
        path = f"/apis/resource.k8s.io/v1/resourceslices/{name}"
        # An update (it may update, not patch), as the publisher replaces its own slices.
        changed = world.stack.get_json("resourceslice", name)
        changed["metadata"]["labels"] = {"a": "b"}
        _refused(
            world.api.call(world.publisher, "PUT", path, changed),
            "not " + name + " of driver gpu.example.com",
        )
        _refused(world.api.call(world.publisher, "DELETE", path), "of driver gpu.example.com")
        kept = world.stack.get_json("resourceslice", name)
        assert "a" not in (kept["metadata"].get("labels") or {})
    finally:
        world.stack.kubectl("delete", "resourceslice", name, "--ignore-not-found")


def test_the_policies_are_the_bases(world: World) -> None:
    # The stack applies the base's policies as they are (overlays/local-processes).
    rendered = world.stack.kubectl("kustomize", str(REPO / "deploy/kustomize/base/policies"))
    names = {
        d["metadata"]["name"]
        for d in yaml.safe_load_all(rendered.stdout)
        if d and d["kind"] == "ValidatingAdmissionPolicy"
    }
    installed = world.stack.get_json("validatingadmissionpolicies")["items"]
    assert names <= {p["metadata"]["name"] for p in installed}
    for policy in installed:
        # Every expression compiled against the API server's types.
        assert not policy.get("status", {}).get("typeChecking", {}).get("expressionWarnings"), (
            textwrap.shorten(json.dumps(policy["status"]), 400)
        )


def _kubeconfig(world: World, folder: Path, token: str) -> Path:
    """A kubeconfig with ``token``, as the services are given theirs."""
    (folder / "token").write_text(token)
    path = folder / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": world.api.server,
                                              "certificate-authority": world.api.ca}}
                ],
                "users": [{"name": "u", "user": {"tokenFile": str(folder / "token")}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )  # fmt: skip
    return path


async def test_the_probes_own_condition_writer_writes_only_its_node(
    world: World, tmp_path: Path
) -> None:
    kube = await connect(kubeconfig=_kubeconfig(world, tmp_path, world.probe_a))
    try:
        own = ConditionWriter(kube, node=world.node_a, types=frozenset({"NeuronHealth"}))
        faulty = {"NeuronHealth": ("True", "NeuronHasError_SRAM", "device 3")}
        assert await own.write(faulty, now=datetime.now(UTC))
        assert _conditions(world.node(world.node_a))["NeuronHealth"]["reason"] == (
            "NeuronHasError_SRAM"
        )
        other = ConditionWriter(kube, node=world.node_b, types=frozenset({"NeuronHealth"}))
        with pytest.raises(ApiException) as refused:
            await other.write(faulty, now=datetime.now(UTC))
        assert refused.value.status == 403
        assert f"may write only Node {world.node_a}" in str(refused.value)
    finally:
        await kube.close()
    assert _conditions(world.node(world.node_b)).get("NeuronHealth", {}).get("reason") != (
        "NeuronHasError_SRAM"
    )


async def test_the_failure_detectors_own_notes_hold_and_release_a_node(
    world: World, tmp_path: Path
) -> None:
    kube = await connect(kubeconfig=_kubeconfig(world, tmp_path, world.detector))
    try:
        notes = NodeNotes(kube)
        await notes.hold(world.node_a, reason="lost 3 times in 60 s")
        assert FLAPPING in _taints(world.node(world.node_a))
        assert world.node_a in await notes.held_nodes()
        await notes.release(world.node_a, reason="up for 30 s")
        assert all(t["key"] != FLAPPING["key"] for t in _taints(world.node(world.node_a)))
    finally:
        await kube.close()


def test_each_running_health_probe_writes_with_a_token_naming_its_own_node(
    kube_stack: KubeStack,
) -> None:
    # The stack's probes are processes; each has a token bound to a Pod on its node, so the
    # policy holds them as the kubelet's projected tokens hold the DaemonSet's pods.
    state = json.loads((kube_stack.state_dir / "state.json").read_text())
    probes = [c for c in state["components"] if c["kind"] == "health-probe"]
    assert probes
    for probe in probes:
        env = probe["env"]
        whoami = kube_stack.kubectl(
            f"--kubeconfig={env['NEURON_DRA_KUBECONFIG']}", "auth", "whoami", "-o", "json"
        )
        extra = json.loads(whoami.stdout)["status"]["userInfo"]["extra"]
        assert extra["authentication.kubernetes.io/node-name"] == [env["NEURON_DRA_NODE_NAME"]]
        node = kube_stack.get_json("node", env["NEURON_DRA_NODE_NAME"])
        assert "NeuronHealth" in _conditions(node), probe["name"]
