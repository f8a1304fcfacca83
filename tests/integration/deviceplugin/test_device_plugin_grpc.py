"""The device plugin as the kubelet's device manager sees it, over real unix sockets: it
registers every resource on kubelet.sock, serves the device list with health, preferred
sets and allocations, and registers again when the kubelet comes back with a new socket.

The kubelet's side is a ``v1beta1.Registration`` server on ``kubelet.sock`` on the official
gRPC library (grpcio), as the kubelet's is on gRPC-Go's: it records what it is told. The
tests call the plugin with grpcio's client too, as the kubelet's gRPC-Go would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from neuron_dra_common.extended import DEVICE_RESOURCE, MANAGED_RESOURCES
from neuron_dra_common.grpcserver import UnixGrpcServer, unix_target
from neuron_dra_common.kube import connect
from neuron_dra_device_plugin.annotations import ApiAnnotatedPods
from neuron_dra_device_plugin.health import HealthState
from neuron_dra_device_plugin.registration import Registrar
from neuron_dra_device_plugin.servicer import DevicePluginServicer, device_plugin_service
from neuron_dra_protos.deviceplugin.v1beta1 import deviceplugin_pb2 as pb
from neuron_dra_protos.deviceplugin.v1beta1 import deviceplugin_pb2_grpc as pb_grpc

from tests.unit.deviceplugin.helpers import inventory

WAIT = 10.0


class Kubelet(pb_grpc.RegistrationServicer):
    """The device manager's registration endpoint: records each request."""

    def __init__(self) -> None:
        self.requests: list[pb.RegisterRequest] = []
        self.changed = asyncio.Event()

    async def Register(
        self,
        request: pb.RegisterRequest,
        context: grpc.aio.ServicerContext[pb.RegisterRequest, pb.Empty],
    ) -> pb.Empty:
        self.requests.append(request)
        self.changed.set()
        return pb.Empty()

    async def wait_for(self, count: int) -> None:
        async with asyncio.timeout(WAIT):
            while len(self.requests) < count:
                self.changed.clear()
                await self.changed.wait()


@contextlib.asynccontextmanager
async def kubelet_server(directory: Path, kubelet: Kubelet) -> AsyncIterator[None]:
    """The kubelet's ``kubelet.sock`` for the block; gone (as its process is) after it."""
    path = directory / "kubelet.sock"
    server = grpc.aio.server()
    pb_grpc.add_RegistrationServicer_to_server(kubelet, server)
    server.add_insecure_port(unix_target(path))
    await server.start()
    try:
        yield
    finally:
        await server.stop(None)
        path.unlink(missing_ok=True)


def empty_like_a_starting_kubelet(directory: Path) -> None:
    """The kubelet removes the plugins' sockets from its directory when it starts."""
    for sock in directory.glob("neuron-dra-*.sock"):
        sock.unlink()


@pytest.fixture
def directory() -> Iterator[Path]:
    # Socket paths must stay short; pytest's tmp_path may not be.
    with tempfile.TemporaryDirectory(prefix="dp-", dir="/tmp") as short:
        yield Path(short)


@pytest.fixture
def health() -> HealthState:
    return HealthState()


@pytest.fixture
async def registrar(directory: Path, health: HealthState) -> AsyncIterator[Registrar]:
    inv = inventory("trn2.48xlarge")
    servicers = [
        DevicePluginServicer(resource=r, inventory=inv, health=health, dev_root="/host/dev")
        for r in MANAGED_RESOURCES
    ]
    registrar = Registrar(directory, servicers=servicers, interval=0.05)
    task = asyncio.create_task(registrar.run(), name="registrar")
    try:
        yield registrar
    finally:
        registrar.stop()
        await asyncio.wait_for(task, WAIT)


@pytest.fixture
async def plugin(
    directory: Path, registrar: Registrar
) -> AsyncIterator[pb_grpc.DevicePluginAsyncStub]:
    kubelet = Kubelet()
    async with kubelet_server(directory, kubelet):
        await kubelet.wait_for(3)
        async with grpc.aio.insecure_channel(
            unix_target(directory / "neuron-dra-neuron.sock")
        ) as channel:
            yield pb_grpc.DevicePluginStub(channel)


async def test_every_resource_registers_with_its_socket_name(
    directory: Path, registrar: Registrar
) -> None:
    kubelet = Kubelet()
    async with kubelet_server(directory, kubelet):
        await kubelet.wait_for(3)
    assert [(r.version, r.resource_name, r.endpoint) for r in kubelet.requests] == [
        ("v1beta1", "aws.amazon.com/neuron", "neuron-dra-neuron.sock"),
        ("v1beta1", "aws.amazon.com/neurondevice", "neuron-dra-neurondevice.sock"),
        ("v1beta1", "aws.amazon.com/neuroncore", "neuron-dra-neuroncore.sock"),
    ]
    assert all(r.options.get_preferred_allocation_available for r in kubelet.requests)
    assert not any(r.options.pre_start_required for r in kubelet.requests)


async def test_a_restarted_kubelet_gets_every_resource_registered_again(
    directory: Path, registrar: Registrar
) -> None:
    first = Kubelet()
    async with kubelet_server(directory, first):
        await first.wait_for(3)
    empty_like_a_starting_kubelet(directory)
    second = Kubelet()
    async with kubelet_server(directory, second):
        await second.wait_for(3)
        assert sorted(r.resource_name for r in second.requests) == sorted(MANAGED_RESOURCES)
        assert (directory / "neuron-dra-neuroncore.sock").is_socket()


async def test_the_device_list_follows_health(
    plugin: pb_grpc.DevicePluginAsyncStub, health: HealthState
) -> None:
    stream = plugin.ListAndWatch(pb.Empty())
    first = await asyncio.wait_for(stream.read(), WAIT)
    assert isinstance(first, pb.ListAndWatchResponse)
    assert [d.ID for d in first.devices] == [f"neuron{i}" for i in range(16)]
    assert {d.health for d in first.devices} == {"Healthy"}
    health.update("test", frozenset({3}))
    second = await asyncio.wait_for(stream.read(), WAIT)
    assert isinstance(second, pb.ListAndWatchResponse)
    assert [d.ID for d in second.devices if d.health == "Unhealthy"] == ["neuron3"]
    stream.cancel()


async def test_the_preferred_set_is_a_torus_row_and_allocate_gives_its_nodes_and_cores(
    plugin: pb_grpc.DevicePluginAsyncStub,
) -> None:
    options = await plugin.GetDevicePluginOptions(pb.Empty())
    assert options.get_preferred_allocation_available
    free = [f"neuron{i}" for i in range(16) if i != 1]
    preferred = await plugin.GetPreferredAllocation(
        pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(available_deviceIDs=free, allocation_size=4)
            ]
        )
    )
    chosen = list(preferred.container_responses[0].deviceIDs)
    assert chosen == ["neuron4", "neuron5", "neuron6", "neuron7"]
    allocated = await plugin.Allocate(
        pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=chosen)])
    )
    container = allocated.container_responses[0]
    assert dict(container.envs) == {
        "NEURON_RT_VISIBLE_CORES": "16-31",
        "NEURON_LOGICAL_NC_CONFIG": "2",
    }
    assert [(d.container_path, d.host_path) for d in container.devices] == [
        (f"/dev/neuron{i}", f"/host/dev/neuron{i}") for i in (4, 5, 6, 7)
    ]


async def test_allocate_refuses_a_count_the_torus_cannot_serve(
    plugin: pb_grpc.DevicePluginAsyncStub,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await plugin.Allocate(
            pb.AllocateRequest(
                container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=[f"neuron{i}" for i in range(7)])
                ]
            )
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == (
        "Instance type trn2.48xlarge does not support requests for device: 7. "
        "Please request a different number of devices."
    )


async def test_cores_are_served_on_their_own_socket(directory: Path, plugin: object) -> None:
    async with grpc.aio.insecure_channel(
        unix_target(directory / "neuron-dra-neuroncore.sock")
    ) as channel:
        cores = pb_grpc.DevicePluginStub(channel)
        preferred = await cores.GetPreferredAllocation(
            pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=[f"neuroncore{i}" for i in range(64)],
                        allocation_size=9,
                    )
                ]
            )
        )
        chosen = list(preferred.container_responses[0].deviceIDs)
        assert chosen == [f"neuroncore{i}" for i in range(9)]
        allocated = await cores.Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=chosen)])
        )
    container = allocated.container_responses[0]
    assert container.envs["NEURON_RT_VISIBLE_CORES"] == "0-8"
    assert [d.container_path for d in container.devices] == [
        "/dev/neuron0",
        "/dev/neuron1",
        "/dev/neuron2",
    ]


async def test_allocate_serves_the_kubelets_choice_while_the_api_server_is_away(
    directory: Path, health: HealthState
) -> None:
    # A kubeconfig whose server accepts no connection: the annotations cannot be read.
    kubeconfig = directory / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    client = await connect(kubeconfig=kubeconfig)
    servicer = DevicePluginServicer(
        resource=DEVICE_RESOURCE,
        inventory=inventory("trn2.48xlarge"),
        health=health,
        dev_root="/dev",
        pods=ApiAnnotatedPods(client, node="n1"),
    )
    socket = directory / "plugin.sock"
    server = UnixGrpcServer(socket, services=[device_plugin_service(servicer)])
    try:
        async with server, grpc.aio.insecure_channel(unix_target(socket)) as channel:
            allocated = await pb_grpc.DevicePluginStub(channel).Allocate(
                pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=["neuron12"])]
                ),
                timeout=WAIT * 4,
            )
    finally:
        await client.close()
    container = allocated.container_responses[0]
    assert [d.container_path for d in container.devices] == ["/dev/neuron12"]
    assert container.envs["NEURON_RT_VISIBLE_CORES"] == "48-51"


def stale_socket(path: Path) -> None:
    """A socket file nobody listens on, as a kubelet that died leaves behind."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))


async def test_a_kubelet_that_comes_back_over_its_dead_socket_is_registered_with(
    directory: Path, registrar: Registrar
) -> None:
    stale_socket(directory / "kubelet.sock")
    await asyncio.sleep(0.5)
    assert registrar.registrations == 0
    kubelet = Kubelet()
    async with kubelet_server(directory, kubelet):
        # At once, not after the retry delay: the new socket is noticed.
        async with asyncio.timeout(2):
            await kubelet.wait_for(3)
