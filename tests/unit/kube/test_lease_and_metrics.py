"""The pure parts of leader election and of the client's request metric.

The elector itself runs against the real apiserver in tests/integration/kube/test_leader.py.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from neuron_dra_common.kube.leader import LeaseState, decide, read_lease
from neuron_dra_common.kube.metrics import resource_of


def test_a_lease_reads_as_the_apiserver_writes_it() -> None:
    state = read_lease(
        {
            "spec": {
                "holderIdentity": "pod-a",
                "leaseDurationSeconds": 15,
                "renewTime": "2026-01-01T00:00:10.123456Z",
                "leaseTransitions": 3,
            }
        }
    )
    assert state == LeaseState(
        holder="pod-a",
        renewed=datetime(2026, 1, 1, 0, 0, 10, 123456, tzinfo=UTC),
        duration=15.0,
        transitions=3,
    )


def test_a_handed_back_lease_is_free_for_anyone() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    released = LeaseState(holder="", renewed=now, duration=1)
    assert decide(released, me="b", now=now)


@pytest.mark.parametrize(
    ("path", "resource"),
    [
        ("/api/v1/nodes", "nodes"),
        ("/api/v1/nodes/trn2-0", "nodes"),
        ("/api/v1/namespaces", "namespaces"),
        ("/api/v1/namespaces/neuron-dra-driver", "namespaces"),
        ("/api/v1/namespaces/default/pods", "pods"),
        ("/api/v1/namespaces/default/pods/p", "pods"),
        ("/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", "leases"),
        (
            "/apis/neuron.aws.com/v1/namespaces/default/neuronultraserverworkloads/w/status",
            "neuronultraserverworkloads/status",
        ),
        ("/apis/resource.k8s.io/v1/resourceslices", "resourceslices"),
        ("/apis/resource.k8s.io/v1", ""),
    ],
)
def test_requests_are_counted_by_resource(path: str, resource: str) -> None:
    assert resource_of(path) == resource
