"""``v1beta1.DevicePlugin`` for one extended resource, over the pure modules.

- ``ListAndWatch`` sends every unit with its health at once, then again on every change;
- ``GetPreferredAllocation`` answers from the topology engine (:mod:`.choose`);
- ``Allocate`` serves the units the scheduler extension annotated on the pod when there is
  such a pod, else (or when the API server cannot be read) the units the kubelet chose; a
  refusal (a count the instance cannot serve,
  an id this node never listed) fails the call, and the kubelet shows its text on the pod.

``PreStartContainer`` is not used (the options say so); it answers empty.
"""

from __future__ import annotations

import logging
from typing import Protocol

from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream
from neuron_dra_common.extended import CORE_RESOURCE
from neuron_dra_common.topology import InvalidDeviceCount
from neuron_dra_protos.deviceplugin.v1beta1 import deviceplugin_grpc as pb_grpc
from neuron_dra_protos.deviceplugin.v1beta1 import deviceplugin_pb2 as pb

from neuron_dra_device_plugin.choose import preferred_cores, preferred_devices
from neuron_dra_device_plugin.health import HealthState, unit_health
from neuron_dra_device_plugin.inventory import Inventory, UnknownId, unit_name
from neuron_dra_device_plugin.pending import Pending
from neuron_dra_device_plugin.respond import ContainerEdits, container_edits

__all__ = ["OPTIONS", "AnnotatedPods", "DevicePluginServicer", "list_response"]

log = logging.getLogger(__name__)

OPTIONS = pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


class AnnotatedPods(Protocol):
    """Pods on this node that the scheduler extension placed and that wait for their units."""

    async def claim(self, *, resource: str, count: int) -> Pending | None:
        """The pod an allocation of ``count`` units of ``resource`` is for, marked served."""
        ...


def list_response(
    inventory: Inventory, *, resource: str, unhealthy: frozenset[int]
) -> pb.ListAndWatchResponse:
    """Every unit of ``resource`` with its health and NUMA node."""
    devices = []
    for unit, health in unit_health(inventory, resource=resource, unhealthy=unhealthy):
        device = inventory.device_of(unit) if resource == CORE_RESOURCE else unit
        numa = inventory.numa.get(device)
        topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=numa)]) if numa is not None else None
        devices.append(pb.Device(ID=unit_name(resource, unit), health=health, topology=topology))
    return pb.ListAndWatchResponse(devices=devices)


def _container_response(edits: ContainerEdits) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=edits.env,
        devices=[
            pb.DeviceSpec(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in edits.devices
        ],
    )


class DevicePluginServicer(pb_grpc.DevicePluginBase):
    def __init__(
        self,
        *,
        resource: str,
        inventory: Inventory,
        health: HealthState,
        dev_root: str,
        pods: AnnotatedPods | None = None,
    ) -> None:
        self.resource = resource
        self._inventory = inventory
        self._health = health
        self._dev_root = dev_root
        self._pods = pods

    async def GetDevicePluginOptions(
        self, stream: Stream[pb.Empty, pb.DevicePluginOptions]
    ) -> None:
        await stream.recv_message()
        await stream.send_message(OPTIONS)

    async def ListAndWatch(self, stream: Stream[pb.Empty, pb.ListAndWatchResponse]) -> None:
        await stream.recv_message()
        while True:
            changed = self._health.next_change()
            unhealthy = self._health.unhealthy
            log.info(
                "sending devices",
                extra={"resource": self.resource, "unhealthy": sorted(unhealthy)},
            )
            await stream.send_message(
                list_response(self._inventory, resource=self.resource, unhealthy=unhealthy)
            )
            await changed.wait()

    async def GetPreferredAllocation(
        self, stream: Stream[pb.PreferredAllocationRequest, pb.PreferredAllocationResponse]
    ) -> None:
        request = await stream.recv_message()
        assert request is not None  # a unary call always carries its message
        await stream.send_message(self.preferred(request))

    def preferred(self, request: pb.PreferredAllocationRequest) -> pb.PreferredAllocationResponse:
        """The answer to ``GetPreferredAllocation``; a unit this node never listed is an
        ``INVALID_ARGUMENT`` error."""
        responses = []
        for ask in request.container_requests:
            try:
                available = self._inventory.parse(self.resource, ask.available_deviceIDs)
                must = self._inventory.parse(self.resource, ask.must_include_deviceIDs)
            except UnknownId as exc:
                raise GRPCError(Status.INVALID_ARGUMENT, str(exc)) from exc
            if self.resource == CORE_RESOURCE:
                chosen = preferred_cores(
                    available=available,
                    must_include=must,
                    size=ask.allocation_size,
                    cores_per_device=self._inventory.cores_per_device,
                )
            else:
                chosen = preferred_devices(
                    self._inventory.spec,
                    available=available,
                    must_include=must,
                    size=ask.allocation_size,
                )
            responses.append(
                pb.ContainerPreferredAllocationResponse(
                    deviceIDs=[unit_name(self.resource, u) for u in chosen]
                )
            )
        return pb.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(self, stream: Stream[pb.AllocateRequest, pb.AllocateResponse]) -> None:
        request = await stream.recv_message()
        assert request is not None  # a unary call always carries its message
        await stream.send_message(await self.allocate(request))

    async def allocate(self, request: pb.AllocateRequest) -> pb.AllocateResponse:
        """The answer to ``Allocate``; a refusal is an ``INVALID_ARGUMENT`` error whose text
        the kubelet shows on the pod."""
        responses = []
        for ask in request.container_requests:
            try:
                units = self._inventory.parse(self.resource, ask.devices_ids)
                units = await self._annotated(units)
                edits = container_edits(
                    self._inventory, resource=self.resource, units=units, dev_root=self._dev_root
                )
            except (UnknownId, InvalidDeviceCount) as exc:
                log.warning(
                    "allocation refused", extra={"resource": self.resource, "error": str(exc)}
                )
                raise GRPCError(Status.INVALID_ARGUMENT, str(exc)) from exc
            log.info(
                "allocated",
                extra={
                    "resource": self.resource,
                    "units": list(edits.units),
                    "visible_cores": edits.env["NEURON_RT_VISIBLE_CORES"],
                },
            )
            responses.append(_container_response(edits))
        return pb.AllocateResponse(container_responses=responses)

    async def _annotated(self, units: tuple[int, ...]) -> tuple[int, ...]:
        """The extension's choice for the pod this is for, if it made one; else ``units``."""
        if self._pods is None:
            return units
        try:
            pending = await self._pods.claim(resource=self.resource, count=len(units))
        except Exception as exc:  # any failure to read the pods: the API server is advisory here
            # Refusing would stop every Neuron pod on the node while the API server is away;
            # the kubelet's choice is one of our preferred connected sets anyway.
            log.warning(
                "pod annotations unreadable; serving the kubelet's choice",
                extra={"resource": self.resource, "error": repr(exc)},
            )
            return units
        if pending is None:
            return units
        known = set(self._inventory.units(self.resource))
        if not known.issuperset(pending.units):
            raise UnknownId(
                f"pod {pending.namespace}/{pending.name}: annotated ids "
                f"{','.join(map(str, pending.units))} are not all this node's {self.resource}"
            )
        log.info(
            "serving the scheduler extension's choice",
            extra={"pod": f"{pending.namespace}/{pending.name}", "units": list(pending.units)},
        )
        return pending.units

    async def PreStartContainer(
        self, stream: Stream[pb.PreStartContainerRequest, pb.PreStartContainerResponse]
    ) -> None:
        await stream.recv_message()
        await stream.send_message(pb.PreStartContainerResponse())
