"""The plugin's wiring: the node's hardware as an inventory, the health probe, one servicer
per resource, the registrar that keeps them registered with the kubelet, and ``/healthz``.

The kubelet path never waits for the API server: the client is only used inside Allocate, to
honour the scheduler extension's annotations.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from neuron_dra_common.hardware.node import read_node
from neuron_dra_common.kube import connect
from neuron_dra_common.runtime.process import Service
from neuron_dra_common.topology import instance_spec, logical_cores_per_device

from neuron_dra_device_plugin.annotations import ApiAnnotatedPods
from neuron_dra_device_plugin.health import HealthState, PresenceProbe
from neuron_dra_device_plugin.inventory import Inventory
from neuron_dra_device_plugin.registration import Registrar
from neuron_dra_device_plugin.servicer import AnnotatedPods, DevicePluginServicer
from neuron_dra_device_plugin.settings import DevicePluginSettings

__all__ = ["NAME", "build", "inventory_of"]

log = logging.getLogger(__name__)

NAME = "device-plugin"


def inventory_of(settings: DevicePluginSettings) -> Inventory:
    """This node's devices, read from the hardware under ``host_root``."""
    hardware = read_node(
        Path(settings.host_root),
        neuron_ls_command=settings.neuron_ls_command or None,
        neuron_ls_path=Path(settings.neuron_ls_path) if settings.neuron_ls_path else None,
        instance_type=settings.instance_type or None,
    )
    spec = instance_spec(hardware.instance_type)
    lnc = hardware.default_lnc if hardware.default_lnc is not None else spec.default_lnc
    return Inventory(
        instance_type=hardware.instance_type,
        spec=spec,
        devices=tuple(sorted(d.index for d in hardware.devices)),
        cores_per_device=logical_cores_per_device(spec, lnc),
        lnc=lnc,
        numa={d.index: d.numa_node for d in hardware.devices if d.numa_node is not None},
    )


async def _watch_health(
    probe: PresenceProbe, state: HealthState, *, interval: float, stopped: asyncio.Event
) -> None:
    while not stopped.is_set():
        unhealthy = await asyncio.to_thread(probe.unhealthy)
        if state.set(unhealthy):
            log.info("device health changed", extra={"unhealthy": sorted(unhealthy)})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopped.wait(), timeout=interval)


async def build(settings: DevicePluginSettings, *, inventory: Inventory) -> Service:
    """Wire the plugin into a service."""
    host_root = Path(settings.host_root)
    dev_root = settings.dev_root or str(host_root / "dev")
    state = HealthState()
    probe = PresenceProbe(host_root=host_root, devices=inventory.devices)
    state.set(probe.unhealthy())

    service = Service(name=NAME, settings=settings)
    pods: AnnotatedPods | None = None
    if settings.honour_annotations:
        client = await connect(kubeconfig=settings.kubeconfig or None)
        pods = ApiAnnotatedPods(client, node=settings.node_name)
        service.on_shutdown(client.close)
    servicers = [
        DevicePluginServicer(
            resource=resource, inventory=inventory, health=state, dev_root=dev_root, pods=pods
        )
        for resource in settings.resources
    ]
    registrar = Registrar(
        Path(settings.kubelet_root) / "device-plugins",
        servicers=servicers,
        interval=settings.kubelet_watch_interval,
    )
    stopped = asyncio.Event()
    service.add_task(
        "kubelet",
        registrar.run,
        stop=registrar.stop,
        ready=lambda: registrar.registered == len(servicers),
    )
    service.add_task(
        "health",
        lambda: _watch_health(probe, state, interval=settings.health_interval, stopped=stopped),
        stop=stopped.set,
    )
    log.info(
        "serving",
        extra={
            "node": settings.node_name,
            "instance_type": inventory.instance_type,
            "devices": len(inventory.devices),
            "cores_per_device": inventory.cores_per_device,
            "resources": list(settings.resources),
        },
    )
    return service
