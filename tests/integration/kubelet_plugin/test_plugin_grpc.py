"""The plugin's gRPC servers on real unix sockets, called by real gRPC clients."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import grpc
import pytest
from neuron_dra_common import cdi
from neuron_dra_common.grpcserver import SocketPathError, UnixGrpcServer
from neuron_dra_kubelet_plugin.checkpoint import CheckpointStore
from neuron_dra_kubelet_plugin.health import DeviceHealthReport, Health, StaticHealth
from neuron_dra_kubelet_plugin.preparer import Effects, NodePreparer
from neuron_dra_kubelet_plugin.registration import socket_paths
from neuron_dra_kubelet_plugin.servers import PluginServers, serve
from neuron_dra_protos.dra.v1 import dra_pb2 as v1
from neuron_dra_protos.dra.v1 import dra_pb2_grpc as v1_grpc
from neuron_dra_protos.dra.v1beta1 import dra_pb2 as v1beta1
from neuron_dra_protos.dra.v1beta1 import dra_pb2_grpc as v1beta1_grpc
from neuron_dra_protos.health.v1alpha1 import health_pb2, health_pb2_grpc
from neuron_dra_protos.registration.v1 import registration_pb2, registration_pb2_grpc

from tests.unit.kubelet_plugin.support import (
    NODE,
    MemoryClaims,
    trn2_node,
)


def claim(uid: str, name: str) -> v1.Claim:
    return v1.Claim(namespace="default", name=name, uid=uid)


async def test_registration(plugin: tuple[PluginServers, StaticHealth], root: Path) -> None:
    servers, _ = plugin
    paths = socket_paths(root / "kubelet")
    async with grpc.aio.insecure_channel(f"unix://{paths.registration}") as channel:
        stub = registration_pb2_grpc.RegistrationStub(channel)
        info = await stub.GetInfo(registration_pb2.InfoRequest())
        assert (info.type, info.name, info.endpoint) == (
            "DRAPlugin",
            "neuron.aws.com",
            str(paths.dra),
        )
        assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        await stub.NotifyRegistrationStatus(
            registration_pb2.RegistrationStatus(plugin_registered=True)
        )
    assert servers.registration.registered.is_set()


async def test_prepare_v1_answers_every_claim(
    plugin: tuple[PluginServers, StaticHealth], root: Path
) -> None:
    servers, _ = plugin
    async with grpc.aio.insecure_channel(servers.dra.target) as channel:
        stub = v1_grpc.DRAPluginStub(channel)
        response = await stub.NodePrepareResources(
            v1.NodePrepareResourcesRequest(
                claims=[
                    claim("u-1x4", "pod0-neurons"),
                    claim("u-bad", "bad"),
                    claim("u-sub", "sub"),
                    claim("u-gone", "gone"),
                ]
            ),
            timeout=45,
        )
    assert set(response.claims) == {"u-1x4", "u-bad", "u-sub", "u-gone"}
    ok = response.claims["u-1x4"]
    assert ok.error == ""
    assert sorted(d.device_name for d in ok.devices) == [f"neurondevice{i}" for i in range(4)]
    assert all(d.pool_name == NODE and list(d.request_names) == ["neurons"] for d in ok.devices)
    assert not ok.devices[0].HasField("share_id")
    assert response.claims["u-bad"].error == (
        "ResourceClaim default/bad: config[0].opaque.parameters.logicalNeuronCore: 3 is not one of 1, 2"
    )
    assert list(response.claims["u-sub"].devices[0].request_names) == ["neurons"]
    assert response.claims["u-gone"].error == "ResourceClaim default/gone: not found"

    spec = cdi.read_claim_spec(root / "cdi", "u-1x4")
    assert spec is not None
    ids = {i for d in ok.devices for i in d.cdi_device_ids}
    assert ids == {cdi.qualified_device_id(d.name, spec.kind) for d in spec.devices}
    assert "NEURON_RT_VISIBLE_CORES=0-15" in spec.container_edits.env

    async with grpc.aio.insecure_channel(servers.dra.target) as channel:
        stub = v1_grpc.DRAPluginStub(channel)
        unprepared = await stub.NodeUnprepareResources(
            v1.NodeUnprepareResourcesRequest(
                claims=[claim("u-1x4", "pod0-neurons"), claim("u-gone", "gone")]
            )
        )
    assert {uid: r.error for uid, r in unprepared.claims.items()} == {"u-1x4": "", "u-gone": ""}
    assert cdi.read_claim_spec(root / "cdi", "u-1x4") is None


async def test_prepare_v1beta1_answers_like_v1(
    plugin: tuple[PluginServers, StaticHealth], root: Path
) -> None:
    servers, _ = plugin
    async with grpc.aio.insecure_channel(servers.dra.target) as channel:
        stub = v1beta1_grpc.DRAPluginStub(channel)
        request = v1beta1.NodePrepareResourcesRequest(
            claims=[v1beta1.Claim(namespace="default", name="lnc1", uid="u-lnc1")]
        )
        first = await stub.NodePrepareResources(request)
        again = await stub.NodePrepareResources(request)
    assert first == again
    assert first.claims["u-lnc1"].error == ""
    assert len(first.claims["u-lnc1"].devices) == 8
    spec = cdi.read_claim_spec(root / "cdi", "u-lnc1")
    assert spec is not None
    assert set(spec.container_edits.env) == {
        "NEURON_RT_VISIBLE_CORES=64-127",
        "NEURON_LOGICAL_NC_CONFIG=1",
    }


async def test_health_stream_lists_every_device_and_beats(
    plugin: tuple[PluginServers, StaticHealth],
) -> None:
    servers, health = plugin
    async with grpc.aio.insecure_channel(servers.dra.target) as channel:
        stub = health_pb2_grpc.DRAResourceHealthStub(channel)
        stream = stub.NodeWatchResources(health_pb2.NodeWatchResourcesRequest())
        first = await stream.read()
        assert isinstance(first, health_pb2.NodeWatchResourcesResponse)
        assert sorted(d.device.device_name for d in first.devices) == sorted(
            f"neurondevice{i}" for i in range(16)
        )
        assert all(
            d.health == health_pb2.HEALTHY and d.device.pool_name == NODE for d in first.devices
        )
        heartbeat = await asyncio.wait_for(stream.read(), 5)
        assert isinstance(heartbeat, health_pb2.NodeWatchResourcesResponse)
        assert len(heartbeat.devices) == 16
        health.update(
            DeviceHealthReport(
                pool=NODE,
                device="neurondevice3",
                health=Health.UNHEALTHY,
                updated_at=1,
                message="HBM_UNCORRECTABLE_ERROR",
            )
        )
        changed = await asyncio.wait_for(stream.read(), 5)
        assert isinstance(changed, health_pb2.NodeWatchResourcesResponse)
        bad = [d for d in changed.devices if d.health == health_pb2.UNHEALTHY]
        assert [(d.device.device_name, d.message) for d in bad] == [
            ("neurondevice3", "HBM_UNCORRECTABLE_ERROR")
        ]
        stream.cancel()


async def test_sockets_are_removed_on_exit(root: Path) -> None:
    paths = socket_paths(root / "kubelet", pod_uid="pod-1")
    preparer = NodePreparer(
        node=trn2_node(),
        claims=MemoryClaims(),
        effects=Effects(store=CheckpointStore(root / "cp.json"), cdi_root=root / "cdi"),
        boot_id="b",
    )
    async with serve(paths, preparer=preparer, health=StaticHealth(pool=NODE, devices=[])):
        assert paths.registration.is_socket()
        assert paths.dra.name == "dra-pod-1.sock"
        assert paths.dra.is_socket()
    assert not paths.registration.exists()
    assert not paths.dra.exists()


async def test_stale_socket_is_replaced_and_other_files_are_not(root: Path) -> None:
    path = root / "s.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # a socket file with nobody behind it, as a killed process leaves
    async with UnixGrpcServer(path, services=[]) as server:
        assert path.is_socket()
        assert server.target == f"unix://{path}"
    assert not path.exists()
    path.write_text("not a socket")
    with pytest.raises(SocketPathError, match="exists and is not a socket"):
        await UnixGrpcServer(path, services=[]).start()


def test_too_long_socket_path_is_refused() -> None:
    with pytest.raises(SocketPathError, match="longer than"):
        UnixGrpcServer(Path("/" + "x" * 200), services=[])
