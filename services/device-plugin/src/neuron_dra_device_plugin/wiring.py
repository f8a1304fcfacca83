"""The plugin's wiring: the node's hardware as an inventory, the health sources (the devices'
presence, the health monitor's events on NATS), the node's heartbeats, one servicer per
resource, the registrar that keeps them registered with the kubelet, and ``/healthz``.

The kubelet path never waits for the API server: the client is only used inside Allocate, to
honour the scheduler extension's annotations.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from neuron_dra_common.hardware.node import read_node
from neuron_dra_common.kube import connect
from neuron_dra_common.runtime.process import Service
from neuron_dra_common.topology import instance_spec, logical_cores_per_device

from neuron_dra_device_plugin.annotations import ApiAnnotatedPods
from neuron_dra_device_plugin.bushealth import BusHealthFeed
from neuron_dra_device_plugin.health import HealthState, PresenceProbe
from neuron_dra_device_plugin.inventory import Inventory
from neuron_dra_device_plugin.registration import Registrar, kubelet_socket_probe
from neuron_dra_device_plugin.servicer import AnnotatedPods, DevicePluginServicer
from neuron_dra_device_plugin.settings import DevicePluginSettings

if TYPE_CHECKING:
    from neuron_dra_common.bus import Bus
    from neuron_dra_common.liveness import Heartbeat

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


async def _on_bus(
    settings: DevicePluginSettings,
    *,
    feed: BusHealthFeed | None,
    heartbeat: Callable[[Bus], Heartbeat] | None,
    stopped: asyncio.Event,
) -> None:
    """Connect to NATS (retrying for ever), then follow this node's health events and send its
    heartbeats for as long as the connection holds. Without NATS the plugin keeps serving,
    with the devices' presence as its only health source (and the node, sending no heartbeat,
    is declared lost by the failure detector, as a node that cannot reach the bus is)."""
    from neuron_dra_common.bus import Bus, credentials_of, inbox_prefix, limits_of

    attempt = 0
    while not stopped.is_set():
        bus: Bus | None = None
        beating: Heartbeat | None = None
        try:
            bus = await Bus.connect(
                settings.nats_servers,
                name=f"{NAME}-{settings.node_name}",
                limits=limits_of(settings),
                credentials=credentials_of(settings),
                inbox=inbox_prefix("device-plugin", node=settings.node_name),
            )
            await bus.reconcile(replicas=settings.stream_replicas)
            attempt = 0
            async with asyncio.TaskGroup() as group:
                if heartbeat is not None:
                    beating = heartbeat(bus)
                    group.create_task(beating.run(), name="heartbeat")
                if feed is not None:
                    group.create_task(feed.follow(bus), name="health-events")
                await stopped.wait()
                if beating is not None:
                    # The goodbye heartbeat: an orderly stop is not a lost node.
                    beating.stop()
                if feed is not None:
                    feed.stop()
        except Exception as exc:  # NATS unreachable or lost: serve on, retry
            delay = _BUS_RETRY[min(attempt, len(_BUS_RETRY) - 1)]
            attempt += 1
            log.warning("NATS unreachable, retrying", extra={"retry_in": delay, "error": repr(exc)})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), timeout=delay)
        finally:
            if bus is not None:
                await bus.close()


def _heartbeat(
    settings: DevicePluginSettings, *, kubelet_socket: Path
) -> Callable[[Bus], Heartbeat]:
    """The node's heartbeat, sent on each connection to NATS."""
    from neuron_dra_common.bus import AlivePublisher
    from neuron_dra_common.liveness import Heartbeat, kubelet_probe, read_boot_id

    boot_id = read_boot_id(settings.boot_id_path)
    # The kubelet's health endpoint when told, else its device-plugin socket (the plugin's pod
    # is not on the host's network, where the endpoint listens by default).
    probe = (
        kubelet_probe(settings.kubelet_healthz_url)
        if settings.kubelet_healthz_url
        else kubelet_socket_probe(kubelet_socket)
    )

    def make(bus: Bus) -> Heartbeat:
        return Heartbeat(
            publisher=bus.publisher(source=f"/neuron-dra/{NAME}/{settings.node_name}"),
            node=settings.node_name,
            boot_id=boot_id,
            interval=settings.liveness_seconds,
            probe=probe,
            mode=settings.heartbeat_mode,
            alive=AlivePublisher(bus.js, node=settings.node_name),
        )

    return make


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
    feed = (
        BusHealthFeed(node=settings.node_name, devices=inventory.devices, state=state)
        if settings.health_events
        else None
    )
    heartbeat = (
        _heartbeat(settings, kubelet_socket=registrar.kubelet_socket)
        if settings.heartbeats
        else None
    )
    if feed is not None or heartbeat is not None:
        service.add_task(
            "bus",
            lambda: _on_bus(settings, feed=feed, heartbeat=heartbeat, stopped=stopped),
            stop=stopped.set,
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
