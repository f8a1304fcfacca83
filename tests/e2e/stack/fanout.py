"""How many watchers the apiserver sends each ResourceClaim change to, read from its own
metrics (``apiserver_watch_events_total`` counts one per event per watcher)."""

from __future__ import annotations

import re
import time
import uuid

from tests.fixtures.stack import KubeStack

_LABELS = re.compile(r'(\w+)="([^"]*)"')


def _metric(stack: KubeStack, name: str, **match: str) -> float:
    text = stack.kubectl("get", "--raw", "/metrics").stdout
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        labels, _, value = line.rpartition(" ")
        found = dict(_LABELS.findall(labels))
        if all(found.get(k) == v for k, v in match.items()):
            total += float(value)
    return total


def claim_watchers(stack: KubeStack) -> int:
    """Open watches of ResourceClaims (any namespace)."""
    return int(
        _metric(
            stack,
            "apiserver_longrunning_requests",
            resource="resourceclaims",
            verb="WATCH",
        )
    )


def _claim_events(stack: KubeStack) -> float:
    return _metric(stack, "apiserver_watch_events_total", resource="resourceclaims")


def claim_change_fanout(
    stack: KubeStack, *, changes: int = 10, namespace: str = "default"
) -> float:
    """Watch events the apiserver sends per change of one ResourceClaim.

    Creates a claim, changes a label ``changes`` times and deletes it; the watch events sent
    meanwhile, divided by the changes made, is how many watchers each change went to.
    """
    name = f"fanout-{uuid.uuid4().hex[:8]}"
    claim = (
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\n"
        f"metadata: {{name: {name}, namespace: {namespace}}}\n"
        "spec:\n  devices:\n    requests:\n    - name: neurons\n      exactly:\n"
        "        deviceClassName: neuron.aws.com\n        count: 1\n"
    )
    before = _claim_events(stack)
    stack.kubectl("create", "-f", "-", input=claim)
    for i in range(changes):
        stack.kubectl("label", "resourceclaim", name, "-n", namespace, f"step={i}", "--overwrite")
    stack.kubectl("delete", "resourceclaim", name, "-n", namespace, "--wait=true")
    made = changes + 2
    # The metric counts an event when it is written to the watcher: wait until it settles.
    last, after = -1.0, _claim_events(stack)
    deadline = time.monotonic() + 15
    while after != last and time.monotonic() < deadline:
        time.sleep(1.0)
        last, after = after, _claim_events(stack)
    return (after - before) / made
