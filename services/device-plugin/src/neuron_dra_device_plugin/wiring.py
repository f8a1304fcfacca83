"""The plugin's wiring: the node's hardware as an inventory, the health sources (the devices'
presence, the health monitor's events on NATS), one servicer per resource, the registrar that keeps them registered with the kubelet, and ``/healthz``.

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
from neuron_dra_device_plugin.bushealth import BusHealthFeed
from neuron_dra_device_plugin.health import HealthState, PresenceProbe
from neuron_dra_device_plugin.inventory import Inventory
from neuron_dra_device_plugin.registration import Registrar
from neuron_dra_device_plugin.servicer import AnnotatedPods, DevicePluginServicer
from neuron_dra_device_plugin.settings import DevicePluginSettings

__all__ = ["NAME", "build", "inventory_of"]

log = logging.getLogger(__name__)

NAME = "device-plugin"
#: The presence probe's name among the health sources.
PRESENCE = "presence"
_BUS_RETRY = (0.5, 1.0, 2.0, 5.0, 10.0)


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
        if state.update(PRESENCE, unhealthy):
            log.info("device health changed", extra={"unhealthy": sorted(unhealthy)})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopped.wait(), timeout=interval)


async def _follow_health_events(
    settings: DevicePluginSettings, *, feed: BusHealthFeed, stopped: asyncio.Event
) -> None:
    """Connect to NATS (retrying for ever) and follow this node's health events; without
    NATS the plugin keeps serving, with the devices' presence as its only health source."""
    from neuron_dra_common.bus import Bus, credentials_of, limits_of

    attempt = 0
    while not stopped.is_set():
        bus: Bus | None = None
        try:
            bus = await Bus.connect(
                settings.nats_servers,
                name=f"{NAME}-{settings.node_name}",
                limits=limits_of(settings),
                credentials=credentials_of(settings),
            )
            await bus.reconcile(replicas=settings.stream_replicas)
            attempt = 0
            await feed.follow(bus)
        except Exception as exc:  # health events are advisory: keep the last view and retry
            delay = _BUS_RETRY[min(attempt, len(_BUS_RETRY) - 1)]
            attempt += 1
            log.warning(
                "health events unreachable, retrying", extra={"retry_in": delay, "error": repr(exc)}
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), timeout=delay)
        finally:
            if bus is not None:
                await bus.close()


async def build(settings: DevicePluginSettings, *, inventory: Inventory) -> Service:
    """Wire the plugin into a service."""
    host_root = Path(settings.host_root)
    dev_root = settings.dev_root or str(host_root / "dev")
    state = HealthState()
    probe = PresenceProbe(host_root=host_root, devices=inventory.devices)
    state.update(PRESENCE, probe.unhealthy())

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
    if settings.health_events:
        feed = BusHealthFeed(node=settings.node_name, devices=inventory.devices, state=state)

        def stop_feed() -> None:
            stopped.set()
            feed.stop()

        service.add_task(
            "health-events",
            lambda: _follow_health_events(settings, feed=feed, stopped=stopped),
            stop=stop_feed,
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
