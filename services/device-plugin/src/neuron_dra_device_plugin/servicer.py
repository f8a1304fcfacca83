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
from collections.abc import AsyncIterator
from typing import Any, Protocol

import grpc
from neuron_dra_common.extended import CORE_RESOURCE
from neuron_dra_common.grpcserver import Servable
from neuron_dra_common.topology import InvalidDeviceCount
from neuron_dra_protos.deviceplugin.v1beta1 import deviceplugin_pb2 as pb
from neuron_dra_protos.deviceplugin.v1beta1 import deviceplugin_pb2_grpc as pb_grpc

from neuron_dra_device_plugin.choose import preferred_cores, preferred_devices
from neuron_dra_device_plugin.health import HealthState, unit_health
from neuron_dra_device_plugin.inventory import Inventory, UnknownId, unit_name
from neuron_dra_device_plugin.pending import Pending
from neuron_dra_device_plugin.respond import ContainerEdits, container_edits

__all__ = [
    "OPTIONS",
    "AnnotatedPods",
    "DevicePluginServicer",
    "Refused",
    "device_plugin_service",
    "list_response",
]

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


class Refused(Exception):
    """A request this plugin will not serve: answered ``INVALID_ARGUMENT`` with this text."""


_Context = grpc.aio.ServicerContext[Any, Any]


class DevicePluginServicer(pb_grpc.DevicePluginServicer):
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
        self, request: pb.Empty, context: _Context
    ) -> pb.DevicePluginOptions:
        return OPTIONS

    async def ListAndWatch(
        self, request: pb.Empty, context: _Context
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        while True:
            changed = self._health.next_change()
            unhealthy = self._health.unhealthy
            log.info(
                "sending devices",
                extra={"resource": self.resource, "unhealthy": sorted(unhealthy)},
            )
            yield list_response(self._inventory, resource=self.resource, unhealthy=unhealthy)
            await changed.wait()

    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: _Context
    ) -> pb.PreferredAllocationResponse:
        try:
            return self.preferred(request)
        except Refused as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    def preferred(self, request: pb.PreferredAllocationRequest) -> pb.PreferredAllocationResponse:
        """The answer to ``GetPreferredAllocation``; a unit this node never listed is
        :class:`Refused` (an ``INVALID_ARGUMENT`` error)."""
        responses = []
        for ask in request.container_requests:
            try:
                available = self._inventory.parse(self.resource, ask.available_deviceIDs)
                must = self._inventory.parse(self.resource, ask.must_include_deviceIDs)
            except UnknownId as exc:
                raise Refused(str(exc)) from exc
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

    async def Allocate(self, request: pb.AllocateRequest, context: _Context) -> pb.AllocateResponse:
        try:
            return await self.allocate(request)
        except Refused as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def allocate(self, request: pb.AllocateRequest) -> pb.AllocateResponse:
        """The answer to ``Allocate``; a refusal is :class:`Refused` (an ``INVALID_ARGUMENT``
        error whose text the kubelet shows on the pod)."""
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
                raise Refused(str(exc)) from exc
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
        self, request: pb.PreStartContainerRequest, context: _Context
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


def device_plugin_service(servicer: DevicePluginServicer) -> Servable:
    """``servicer`` as a server registers it."""
    return Servable(pb_grpc.add_DevicePluginServicer_to_server, servicer)
