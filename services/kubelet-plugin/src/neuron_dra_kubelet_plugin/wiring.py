"""The plugin's wiring: the node's hardware, the claim source (a GET of each claim the
kubelet names), the crash-safe preparer, the two gRPC servers, the bus (claim events out, device
health in) and the socket probe behind ``/healthz``. The kubelet path never waits for the
bus: without NATS the plugin still prepares claims and queues its events, and the bus client
is loaded only once the kubelet's servers are up (it is not on the way to registration).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
from neuron_dra_common.driver import device_name
from neuron_dra_common.hardware.node import read_node
from neuron_dra_common.kube import KubeClient, connect
from neuron_dra_common.runtime.process import Service

from neuron_dra_kubelet_plugin import faults
from neuron_dra_kubelet_plugin.bushealth import BusHealth
from neuron_dra_kubelet_plugin.checkpoint import CheckpointStore, read_boot_id
from neuron_dra_kubelet_plugin.claimsource import ApiClaimSource
from neuron_dra_kubelet_plugin.kubeevents import ClaimEventRecorder
from neuron_dra_kubelet_plugin.kubeletcheck import KubeletCheck, KubeletGate
from neuron_dra_kubelet_plugin.liveness import SocketProbe
from neuron_dra_kubelet_plugin.observe import (
    PREPARED_CLAIMS,
    ClaimEvents,
    ObservedPreparer,
    count_unhealthy,
)
from neuron_dra_kubelet_plugin.plan import NodeContext
from neuron_dra_kubelet_plugin.preparer import Effects, NodePreparer
from neuron_dra_kubelet_plugin.registration import socket_paths
from neuron_dra_kubelet_plugin.servers import serve
from neuron_dra_kubelet_plugin.settings import PluginSettings, node_device_for
from neuron_dra_kubelet_plugin.told import ToldLedger
from neuron_dra_kubelet_plugin.ultraserver import UltraServerGate

if TYPE_CHECKING:
    from neuron_dra_common.bus import Bus

__all__ = ["NAME", "build", "node_context"]

log = logging.getLogger(__name__)

NAME = "kubelet-plugin"
_BUS_RETRY = (0.5, 1.0, 2.0, 5.0, 10.0)


def node_context(settings: PluginSettings) -> NodeContext:
    """This node as prepare sees it, read from the hardware under ``host_root``."""
    root = Path(settings.host_root)
    hardware = read_node(
        root,
        neuron_ls_command=settings.neuron_ls_command or None,
        neuron_ls_path=Path(settings.neuron_ls_path) if settings.neuron_ls_path else None,
        instance_type=settings.instance_type or None,
    )
    # The container runtime reads CDI specs on the host: device paths are host paths, which
    # differ from where this container reads sysfs when the host is mounted elsewhere.
    dev_root = settings.dev_root or str(root / "dev")
    node = NodeContext.from_hardware(hardware, pool=settings.node_name, dev_root=dev_root)
    return msgspec.structs.replace(node, node_device=node_device_for(node.instance))


async def _keep_bus(
    settings: PluginSettings,
    *,
    events: ClaimEvents,
    health: BusHealth,
    serving: asyncio.Event,
    stopped: asyncio.Event,
) -> None:
    """Once the kubelet's servers listen, connect to NATS (retrying for ever), then publish
    events and follow device health."""
    # Loading the client takes the event loop for a while: not before the sockets exist.
    waits = [
        asyncio.create_task(serving.wait(), name="bus-after-serving"),
        asyncio.create_task(stopped.wait(), name="bus-unless-stopped"),
    ]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    if stopped.is_set():
        return
    from neuron_dra_common.bus import Bus, credentials_of, inbox_prefix, limits_of

    attempt = 0
    bus: Bus | None = None
    while bus is None and not stopped.is_set():
        try:
            bus = await Bus.connect(
                settings.nats_servers,
                name=f"{NAME}-{settings.node_name}",
                limits=limits_of(settings),
                credentials=credentials_of(settings),
                inbox=inbox_prefix("kubelet-plugin", node=settings.node_name),
            )
            await bus.reconcile(replicas=settings.stream_replicas)
        except Exception as exc:  # any failure to reach the bus is retried, never fatal
            if bus is not None:
                await bus.close()
                bus = None
            delay = _BUS_RETRY[min(attempt, len(_BUS_RETRY) - 1)]
            attempt += 1
            log.warning("bus unreachable, retrying", extra={"retry_in": delay, "error": repr(exc)})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), timeout=delay)
    if bus is None:
        return
    events.attach(bus.publisher(source=f"/neuron-dra/{NAME}/{settings.node_name}"))
    try:
        while not stopped.is_set():
            try:
                await health.follow(bus)
            except Exception as exc:  # health is advisory: keep the last view and retry
                log.warning("device health feed failed", extra={"error": repr(exc)})
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopped.wait(), timeout=_BUS_RETRY[-1])
    finally:
        events.stop()
        await bus.close()


async def build(settings: PluginSettings, *, node: NodeContext) -> Service:
    """Wire the plugin into a service (recovering the checkpoint before serving)."""
    kubelet_root = Path(settings.kubelet_root)
    paths = socket_paths(kubelet_root, pod_uid=settings.pod_uid or None)
    checkpoint = Path(settings.checkpoint_path or paths.dra.parent / "checkpoint.json")
    boot_id = read_boot_id(Path(settings.boot_id_path))

    client: KubeClient = await connect(kubeconfig=settings.kubeconfig or None)
    events = ClaimEvents(
        node=settings.node_name,
        boot_id=boot_id,
        ledger=ToldLedger(checkpoint.with_name("told.json"), boot_id=boot_id),
    )
    recorder = ClaimEventRecorder(client, node=settings.node_name)
    claims = UltraServerGate(
        ApiClaimSource(client),
        api=client,
        node=settings.node_name,
        ultraserver_member=node.instance.ultraserver_nodes > 1,
    )
    preparer = NodePreparer(
        node=node,
        claims=claims,
        placement=claims.placement,
        effects=Effects(store=CheckpointStore(checkpoint), cdi_root=Path(settings.cdi_root)),
        boot_id=boot_id,
        listener=events,
        reporter=recorder,
        crash=faults.from_env(),
    )
    recovery = preparer.recover()
    if recovery.checkpoint_error:
        log.error(
            "checkpoint unusable; set aside and rebuilt from the CDI specs",
            extra={"checkpoint": str(checkpoint), "error": recovery.checkpoint_error},
        )
    owed = events.tell_owed(preparer.checkpoint)
    log.info(
        "checkpoint recovered",
        extra={
            "claims": len(preparer.checkpoint.claims),
            "rolled_back": list(recovery.rolled_back),
            "stale": list(recovery.stale),
            "orphan_specs": list(recovery.orphan_specs),
            "events_owed": owed,
        },
    )
    PREPARED_CLAIMS.set(len(preparer.checkpoint.claims))
    devices = [device_name(i) for i in sorted(node.devices)]
    health = BusHealth(node=settings.node_name, pool=node.pool, devices=devices)
    count_unhealthy(health)
    probe = SocketProbe(paths, interval=settings.probe_interval)
    kubelet = KubeletCheck(
        client, node=settings.node_name, allow=settings.allow_kubelet_dra_regression
    )

    service = Service(name=NAME, settings=settings)
    serving_up = asyncio.Event()
    stopped = asyncio.Event()

    async def serving() -> None:
        async with serve(
            paths,
            preparer=KubeletGate(
                ObservedPreparer(preparer),
                kubelet,
                claims=ApiClaimSource(client),
                reporter=recorder,
            ),
            health=health,
            heartbeat_seconds=settings.health_heartbeat_seconds,
        ) as servers:
            service.add_readiness("registered", servers.registration.registered.is_set)
            serving_up.set()
            async with asyncio.TaskGroup() as group:
                group.create_task(probe.run(), name="socket-probe")
                await stopped.wait()
                probe.stop()

    def stop() -> None:
        stopped.set()
        health.stop()
        events.stop()
        recorder.stop()

    service.add_task("grpc", serving, stop=stop)
    service.add_task(
        "bus",
        lambda: _keep_bus(
            settings, events=events, health=health, serving=serving_up, stopped=stopped
        ),
    )
    service.add_task("claim-events", events.run)
    service.add_task("failure-events", recorder.run)
    service.add_task("kubelet-check", kubelet.run, stop=kubelet.stop)
    service.http.add_liveness("sockets", probe.alive)
    service.on_shutdown(client.close)
    return service
