"""The checkpoint across releases and damage, and the v1beta1 service."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from neuron_dra_cli.stack.nodes import kubelet_root
from neuron_dra_kubelet_plugin.registration import socket_paths
from neuron_dra_protos.dra.v1 import dra_pb2 as v1
from neuron_dra_protos.dra.v1 import dra_pb2_grpc as v1_grpc
from neuron_dra_protos.dra.v1beta1 import dra_pb2 as v1beta1
from neuron_dra_protos.dra.v1beta1 import dra_pb2_grpc as v1beta1_grpc

from tests.e2e.actuate.pods import claim_pod
from tests.e2e.actuate.support import Actuate

pytestmark = pytest.mark.stack

NODE = "inf2-48xl-0"
GOLDEN_V1 = Path(__file__).parents[2] / "unit" / "kubelet_plugin" / "golden" / "checkpoint_v1.json"


def log_records(actuate: Actuate, since: int) -> list[dict[str, Any]]:
    lines = actuate.log(NODE).read_bytes()[since:].decode(errors="replace").splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def restart_with(actuate: Actuate, content: bytes) -> int:
    """Kill the plugin, put ``content`` in its checkpoint, start it; the log offset before."""
    actuate.kill_plugin(NODE)
    actuate.checkpoint_path(NODE).write_bytes(content)
    since = actuate.log(NODE).stat().st_size
    actuate.start_plugin(NODE)
    actuate.wait_plugin_ready(NODE)
    return since


def test_a_checkpoint_of_the_previous_format_loads(actuate: Actuate) -> None:
    since = restart_with(actuate, GOLDEN_V1.read_bytes())
    records = log_records(actuate, since)
    recovered = [r for r in records if r.get("message") == "checkpoint recovered"]
    assert recovered, records
    # Written under another boot id: its claims are from before a reboot, so not in effect.
    assert sorted(recovered[0]["stale"]) == sorted(
        json.loads(GOLDEN_V1.read_text())["data"]["claims"]
    )
    assert not [r for r in records if r.get("level") == "error"]


def test_a_corrupted_checkpoint_is_reported_and_rebuilt(actuate: Actuate) -> None:
    actuate.apply(claim_pod("ckpt-holder", node=NODE, count=2))
    try:
        actuate.wait_running("ckpt-holder")
        uid = actuate.claim_of("ckpt-holder")["metadata"]["uid"]
        path = actuate.checkpoint_path(NODE)
        since = restart_with(actuate, path.read_bytes()[:-20] + b"garbage")
        errors = [
            r
            for r in log_records(actuate, since)
            if r.get("message") == "checkpoint unusable; set aside and rebuilt from the CDI specs"
        ]
        assert len(errors) == 1
        assert errors[0]["level"] == "error"
        assert f"{NODE}/kubelet/plugins/neuron.aws.com/checkpoint.json" in str(errors[0]["error"])
        assert "not a checkpoint file" in str(errors[0]["error"])
        assert path.with_name(path.name + ".corrupt").exists()
        # Rebuilt from the CDI specs: the running claim is still known and still held.
        assert actuate.checkpoint(NODE)[uid]["state"] == "PrepareCompleted"
        # Up and serving, not crash-looping: a second claim on the node prepares.
        actuate.apply(claim_pod("ckpt-second", node=NODE, count=1))
        actuate.wait_running("ckpt-second")
        actuate.delete_pod("ckpt-second")
    finally:
        actuate.delete_pod("ckpt-holder")
    assert uid not in actuate.cdi_specs(NODE)
    assert uid not in actuate.checkpoint(NODE)


def test_v1beta1_answers_like_v1(actuate: Actuate) -> None:
    actuate.apply(claim_pod("beta-holder", node=NODE, count=3))
    try:
        actuate.wait_running("beta-holder")
        claim = actuate.claim_of("beta-holder")
        meta = claim["metadata"]
        dra = socket_paths(kubelet_root(actuate.layout, NODE)).dra

        async def both() -> tuple[
            v1.NodePrepareResourcesResponse, v1beta1.NodePrepareResourcesResponse
        ]:
            async with grpc.aio.insecure_channel(f"unix://{dra}") as channel:
                one = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(
                    v1.NodePrepareResourcesRequest(
                        claims=[v1.Claim(namespace="default", name=meta["name"], uid=meta["uid"])]
                    )
                )
                beta = await v1beta1_grpc.DRAPluginStub(channel).NodePrepareResources(
                    v1beta1.NodePrepareResourcesRequest(
                        claims=[
                            v1beta1.Claim(namespace="default", name=meta["name"], uid=meta["uid"])
                        ]
                    )
                )
                return one, beta

        one, beta = asyncio.run(both())
        a, b = one.claims[meta["uid"]], beta.claims[meta["uid"]]
        assert a.error == b.error == ""

        def view(ds: Any) -> list[tuple[Any, ...]]:
            return sorted(
                (d.pool_name, d.device_name, tuple(d.request_names), tuple(d.cdi_device_ids))
                for d in ds
            )

        assert view(a.devices) == view(b.devices)
        assert len(a.devices) == 3
    finally:
        actuate.delete_pod("beta-holder")
