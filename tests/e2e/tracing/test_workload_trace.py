"""One trace per allocation, read back from Jaeger.

The contract: the UltraServer operator's reconcile of a workload is the root span
``reconcile NeuronUltraServerWorkload``; its allocator request crosses NATS with the trace
context in the headers; it writes the W3C traceparent of its span as annotation
``neuron.aws.com/traceparent`` into the generated ResourceClaimTemplate's
``spec.metadata.annotations`` (so every claim made from it carries it) and onto the Node
record it writes for the slice publisher. The slice publisher's tag write, the kubelet
plugin's prepare (with the CDI write under it) and the scheduler's allocation (rebuilt by the
plugin from the claim's status, linked from prepare) join that trace.

``test_the_workloads_allocation_is_one_trace`` checks all of it from a user's workload.
``test_the_driver_joins_the_trace_its_objects_name`` checks the parts after the operator
with a traceparent written by hand on the Nodes and on a template, so that it does not
depend on what the operator writes.
"""

from __future__ import annotations

import json
import secrets
import textwrap
from typing import Any

import pytest
from neuron_dra_common.telemetry import TRACEPARENT_ANNOTATION

from tests.e2e.tracing.jaeger import Span, Trace, find_traces, get_trace
from tests.e2e.ultraserver.converged import wait_state, workload
from tests.fixtures.stack import KubeStack

pytestmark = pytest.mark.stack

ROOT = "reconcile NeuronUltraServerWorkload"
ALLOCATE = "allocate NeuronUltraServerWorkload"
TAG = "tag ResourceSlices"
SCHEDULE = "kube-scheduler allocate ResourceClaim"
PREPARE = "prepare ResourceClaim"
CDI = "write CDI spec"


def pod(name: str, template: str) -> str:
    return textwrap.dedent(
        f"""\
        apiVersion: v1
        kind: Pod
        metadata:
          name: {name}
        spec:
          containers:
          - name: ctr0
            image: public.ecr.aws/docker/library/alpine:latest
            command: ["sleep", "infinity"]
            resources:
              claims:
              - name: neuron
          resourceClaims:
          - name: neuron
            resourceClaimTemplateName: {template}
        """
    )


def run_pod(stack: KubeStack, name: str, template: str) -> dict[str, Any]:
    stack.kubectl("apply", "-f", "-", input=pod(name, template))
    running: dict[str, Any] = stack.wait_for(
        f"pod {name} Running",
        lambda: (p := stack.get_json("pod", name))["status"].get("phase") == "Running" and p,
        timeout=120,
    )
    return running


def split(traceparent: str) -> tuple[str, str]:
    """(trace id, span id) of a W3C traceparent."""
    version, trace_id, span_id, _flags = traceparent.split("-")
    assert version == "00", traceparent
    return trace_id, span_id


def wait_trace(stack: KubeStack, trace_id: str, *names: tuple[str, str]) -> Trace:
    """The trace once it holds a span of each (service, name): spans arrive in batches."""

    def complete() -> Trace | None:
        found = get_trace(stack, trace_id)
        have = {(s.service, s.name) for s in found.spans}
        return found if set(names) <= have else None

    try:
        result: Trace = stack.wait_for(f"spans {names} in trace {trace_id}", complete, timeout=60)
    except AssertionError:
        spans = sorted((s.service, s.name) for s in get_trace(stack, trace_id).spans)
        raise AssertionError(f"trace {trace_id} lacks some of {names}; it holds {spans}") from None
    return result


def assert_prepared_in(trace: Trace, *, parent_id: str, node: str, claim: str) -> Span:
    """Prepare under ``parent_id``, the CDI write under prepare, the scheduler's allocation
    beside it and linked from it; all sent by the plugin of ``node``."""
    prepares = [
        s
        for s in trace.named(PREPARE, service="kubelet-plugin")
        if s.attributes.get("k8s.resourceclaim.name") == claim
    ]
    assert len(prepares) == 1, [s.attributes for s in trace.named(PREPARE)]
    [prepare] = prepares
    assert prepare.parent_id == parent_id
    assert not prepare.error
    assert prepare.resource["k8s.node.name"] == node
    assert prepare.resource["service.namespace"] == "neuron-dra"
    assert prepare.resource["service.version"]
    [cdi] = [
        s for s in trace.named(CDI, service="kubelet-plugin") if s.parent_id == prepare.span_id
    ]
    assert prepare.start_ns <= cdi.start_ns <= cdi.end_ns <= prepare.end_ns
    [schedule] = [
        s
        for s in trace.named(SCHEDULE, service="kubelet-plugin")
        if s.attributes.get("k8s.resourceclaim.name") == claim
    ]
    assert schedule.parent_id == parent_id
    assert schedule.span_id in prepare.links
    assert schedule.attributes["neuron.span.rebuilt"] is True
    # The 1.36 scheduler stamps its allocation; it happened before the plugin prepared.
    assert schedule.attributes["neuron.allocation.time_source"] == (
        "status.allocation.allocationTimestamp"
    )
    assert schedule.start_ns <= prepare.start_ns
    assert {d.split("/")[0] for d in schedule.attributes["neuron.devices"]} == {node}
    return prepare


def test_the_workloads_allocation_is_one_trace(traced_stack: KubeStack) -> None:
    stack = traced_stack
    stack.kubectl("apply", "-f", "-", input=workload("traced", size=1))
    status = wait_state(stack, "traced", "Allocated")
    [node] = [n["nodeName"] for a in status["allocations"] for n in a["nodes"]]
    rct_name = stack.get_json("nusw", "traced")["spec"].get("resourceClaimTemplate", {}).get(
        "name"
    ) or next(
        t["metadata"]["name"]
        for t in stack.get_json("resourceclaimtemplates")["items"]
        if t["metadata"]["name"].startswith("traced")
    )
    rct = stack.get_json("resourceclaimtemplates", rct_name)
    annotations = (rct["spec"].get("metadata") or {}).get("annotations") or {}
    assert TRACEPARENT_ANNOTATION in annotations, (
        f"ResourceClaimTemplate default/{rct_name}: spec.metadata.annotations has no "
        f"{TRACEPARENT_ANNOTATION} (the operator writes its reconcile span's traceparent there)"
    )
    trace_id, parent_id = split(annotations[TRACEPARENT_ANNOTATION])
    running = run_pod(stack, "traced-0", rct_name)
    assert running["spec"]["nodeName"] == node
    claim = running["status"]["resourceClaimStatuses"][0]["resourceClaimName"]

    trace = wait_trace(
        stack,
        trace_id,
        ("ultraserver-operator", ROOT),
        ("topology-allocator", ALLOCATE),
        ("slice-publisher", TAG),
        ("kubelet-plugin", PREPARE),
        ("kubelet-plugin", CDI),
        ("kubelet-plugin", SCHEDULE),
    )
    roots = [s for s in trace.spans if not s.parent_id]
    assert [(s.service, s.name) for s in roots] == [("ultraserver-operator", ROOT)]
    [root] = roots
    # The span the annotation names is the root or one of its descendants.
    named = trace.by_id(parent_id)
    assert named is not None
    assert named is root or root in trace.ancestors(named)
    [allocate] = trace.named(ALLOCATE, service="topology-allocator")
    assert root in trace.ancestors(allocate)
    assert allocate.attributes["neuron.granted"] is True
    assert allocate.attributes["neuron.nodes"] == [node]
    tags = [
        s
        for s in trace.named(TAG, service="slice-publisher")
        if s.attributes["k8s.node.name"] == node
    ]
    assert len(tags) == 1
    assert root in trace.ancestors(tags[0])
    prepare = assert_prepared_in(trace, parent_id=parent_id, node=node, claim=claim)
    assert root in trace.ancestors(prepare)
    # One story in time order: allocated, tagged, prepared.
    assert allocate.start_ns <= tags[0].start_ns <= prepare.start_ns
    stack.kubectl("delete", "pod", "traced-0", "--timeout=60s")
    stack.kubectl("delete", "nusw", "traced", "--timeout=120s")


def test_the_driver_joins_the_trace_its_objects_name(traced_stack: KubeStack) -> None:
    stack = traced_stack
    trace_id = secrets.token_hex(16)
    node_parent = f"00-{trace_id}-{secrets.token_hex(8)}-01"
    claim_parent_id = secrets.token_hex(8)
    # Before the workload exists: whichever node it gets carries this trace context.
    for node in stack.get_json("nodes")["items"]:
        stack.kubectl(
            "annotate",
            "node",
            node["metadata"]["name"],
            f"{TRACEPARENT_ANNOTATION}={node_parent}",
            "--overwrite",
        )
    stack.kubectl("apply", "-f", "-", input=workload("by-hand", size=1))
    status = wait_state(stack, "by-hand", "Allocated")
    [node] = [n["nodeName"] for a in status["allocations"] for n in a["nodes"]]

    # A template like the generated one, but carrying a trace context written here.
    generated = next(
        t
        for t in stack.get_json("resourceclaimtemplates")["items"]
        if t["metadata"]["name"].startswith("by-hand")
    )
    spec = json.loads(json.dumps(generated["spec"]))
    spec.setdefault("metadata", {}).setdefault("annotations", {})[TRACEPARENT_ANNOTATION] = (
        f"00-{trace_id}-{claim_parent_id}-01"
    )
    template = {
        "apiVersion": generated["apiVersion"],
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "by-hand-traced", "namespace": "default"},
        "spec": spec,
    }
    stack.kubectl("apply", "-f", "-", input=json.dumps(template))
    running = run_pod(stack, "by-hand-0", "by-hand-traced")
    assert running["spec"]["nodeName"] == node
    claim = running["status"]["resourceClaimStatuses"][0]["resourceClaimName"]

    # The operator may have written its own trace context on the Node: the tag write
    # follows whatever the Node says.
    on_node = stack.get_json("node", node)["metadata"]["annotations"][TRACEPARENT_ANNOTATION]
    node_trace, node_span = split(on_node)
    tag_trace = wait_trace(stack, node_trace, ("slice-publisher", TAG))
    [tag] = [s for s in tag_trace.named(TAG) if s.attributes["k8s.node.name"] == node]
    assert tag.parent_id == node_span
    assert tag.attributes["neuron.workload.id"]
    assert tag.resource["service.name"] == "slice-publisher"
    assert tag.resource["service.namespace"] == "neuron-dra"
    # Its Kubernetes calls (the slice writes) are its children.
    assert any(s.parent_id == tag.span_id for s in tag_trace.spans)

    trace = wait_trace(
        stack,
        trace_id,
        ("kubelet-plugin", PREPARE),
        ("kubelet-plugin", CDI),
        ("kubelet-plugin", SCHEDULE),
    )
    assert_prepared_in(trace, parent_id=claim_parent_id, node=node, claim=claim)

    # The allocator's decision is a child of the operator's request, across NATS.
    def allocation_trace() -> Trace | None:
        for tid in find_traces(stack, service="topology-allocator", operation=ALLOCATE):
            t = get_trace(stack, tid)
            for s in t.named(ALLOCATE):
                if s.attributes.get("neuron.workload.name") == "by-hand":
                    return t
        return None

    alloc_trace: Trace = stack.wait_for("the allocator's span for by-hand", allocation_trace)
    [allocate] = [
        s for s in alloc_trace.named(ALLOCATE) if s.attributes["neuron.workload.name"] == "by-hand"
    ]
    services = [s.service for s in alloc_trace.ancestors(allocate)]
    assert "ultraserver-operator" in services, services
    assert allocate.resource["service.name"] == "topology-allocator"
    stack.kubectl("delete", "pod", "by-hand-0", "--timeout=60s")
    stack.kubectl("delete", "resourceclaimtemplate", "by-hand-traced")
    stack.kubectl("delete", "nusw", "by-hand", "--timeout=120s")
