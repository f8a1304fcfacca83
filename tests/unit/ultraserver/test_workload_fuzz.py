"""Fuzzing NeuronUltraServerWorkload objects as the API could return them (the CRD schema
normally refuses bad ones first; an older CRD, or a status written by hand, may not).

A workload either decodes, and the operator's decider answers it with actions, or it is
refused with an error naming the path of the field; nothing else escapes a pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import yaml
from hypothesis import HealthCheck, given, settings
from neuron_dra_ultraserver_operator.decide import decide
from neuron_dra_ultraserver_operator.inputs import Facts, FleetView
from neuron_dra_ultraserver_operator.model import workload_from_api

from tests.contracts.jsonfuzz import spoiled

EXAMPLE = Path(__file__).parents[3] / "examples" / "ultraserver" / "workload.yaml"


def _workload() -> dict[str, Any]:
    """The guide's workload, with what the API adds and a recorded allocation."""
    obj: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    obj["metadata"].update(
        {"namespace": "default", "uid": "uid-1", "generation": 1, "resourceVersion": "7"}
    )
    nodes = [{"nodeName": f"us0-n{i}", "nodeId": i, "topologyId": i} for i in range(4)]
    obj["status"] = {
        "state": "Allocated",
        "allocations": [
            {
                "ultraServer": "us-0000000000000001",
                "serverId": "0000000000000001",
                "ultraserverIndex": 0,
                "mode": 1,
                "leaderNodeName": "us0-n0",
                "nodes": nodes,
            }
        ],
    }
    return obj


FLEET = FleetView(members={}, names={}, server_ids={}, servers={}, ready={})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=spoiled(_workload(), most=4))
def test_a_spoiled_workload_is_refused_naming_the_field_or_decided(obj: dict[str, Any]) -> None:
    try:
        workload = workload_from_api(obj)
    except msgspec.ValidationError as exc:
        message = str(exc)
        assert "`$." in message or "missing required field" in message, message
        return
    decide(workload, FLEET, {}, Facts(now="2026-01-01T00:00:00Z"))
