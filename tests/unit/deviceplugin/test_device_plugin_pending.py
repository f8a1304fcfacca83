"""Which pod an Allocate serves by the scheduler extension's annotations."""

from __future__ import annotations

from typing import Any

from neuron_dra_common.extended import CORE_RESOURCE, DEVICE_RESOURCE, LEGACY_DEVICE_RESOURCE
from neuron_dra_device_plugin.pending import pick_pending


def pod(
    name: str,
    *,
    ids: str,
    kind: str = DEVICE_RESOURCE,
    allocated: str = "false",
    at: int = 1,
    phase: str = "Pending",
) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ml",
            "name": name,
            "uid": f"uid-{name}",
            "annotations": {
                "AWS_NEURON_IDS": ids,
                "NEURON_RESOURCE_TYPE": kind,
                "NEURON_ALLOC_TIME": str(at),
                "NEURON_ALLOCATED": allocated,
            },
        },
        "status": {"phase": phase},
    }


def test_the_oldest_waiting_pod_with_as_many_devices_is_served() -> None:
    pods = [
        pod("late", ids="4,5,6,7", at=20),
        pod("early", ids="0,1,2,3", at=10),
        pod("two", ids="8,9", at=1),
    ]
    chosen = pick_pending(pods, resource=DEVICE_RESOURCE, count=4)
    assert chosen is not None
    assert (chosen.name, chosen.units) == ("early", (0, 1, 2, 3))


def test_served_finished_or_other_kind_pods_are_not_taken() -> None:
    pods = [
        pod("served", ids="0,1,2,3", allocated="true"),
        pod("done", ids="0,1,2,3", phase="Succeeded"),
        pod("cores", ids="0,1,2,3", kind=CORE_RESOURCE),
        pod("garbled", ids="0,x"),
        {"metadata": {"name": "plain"}},
    ]
    assert pick_pending(pods, resource=DEVICE_RESOURCE, count=4) is None


def test_the_older_device_name_reads_the_same_annotation_and_cores_read_theirs() -> None:
    pods = [pod("dev", ids="2"), pod("cores", ids="0,1,2,3,4,5,6,7,8", kind=CORE_RESOURCE)]
    assert pick_pending(pods, resource=LEGACY_DEVICE_RESOURCE, count=1) is not None
    chosen = pick_pending(pods, resource=CORE_RESOURCE, count=9)
    assert chosen is not None
    assert chosen.units == tuple(range(9))
