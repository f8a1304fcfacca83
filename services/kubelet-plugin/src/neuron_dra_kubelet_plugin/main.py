"""Entry point: ``neuron-dra-kubelet-plugin`` / ``python -m neuron_dra_kubelet_plugin``.

Wiring only. Claims are read through a :class:`~neuron_dra_kubelet_plugin.preparer.ClaimSource`;
until the Kubernetes helpers of the common library provide the informer-backed one, every
prepare answers with a per-claim error saying so (unprepare, which needs no claim, works).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import msgspec
from neuron_dra_common.hardware.node import read_node
from neuron_dra_common.runtime.service import Service, run
from neuron_dra_common.settings import ServiceSettings, SettingsError, load
from neuron_dra_common.topology import UnknownInstanceType

from neuron_dra_kubelet_plugin.checkpoint import CheckpointStore, read_boot_id
from neuron_dra_kubelet_plugin.claims import ClaimRef, ResourceClaim
from neuron_dra_kubelet_plugin.health import StaticHealth
from neuron_dra_kubelet_plugin.plan import NodeContext, PrepareError, device_name
from neuron_dra_kubelet_plugin.preparer import Effects, NodePreparer
from neuron_dra_kubelet_plugin.registration import socket_paths
from neuron_dra_kubelet_plugin.service import serve

NAME = "kubelet-plugin"


class PluginSettings(ServiceSettings, frozen=True, kw_only=True):
    node_name: Annotated[str, msgspec.Meta(min_length=1, description="This node's name")] = (
        "unknown-node"
    )
    kubelet_root: Annotated[str, msgspec.Meta(description="The kubelet's root directory")] = (
        "/var/lib/kubelet"
    )
    cdi_root: Annotated[str, msgspec.Meta(description="Where CDI specs are written")] = (
        "/var/run/cdi"
    )
    host_root: Annotated[str, msgspec.Meta(description="Root of the host's /sys and /dev")] = "/"
    pod_uid: Annotated[str, msgspec.Meta(description="Pod UID for rolling-update sockets")] = ""
    checkpoint_path: Annotated[
        str, msgspec.Meta(description="Checkpoint file; empty: under the plugin directory")
    ] = ""


class _NoClaimSource:
    async def get(self, ref: ClaimRef) -> ResourceClaim | None:
        raise PrepareError(f"{ref}: this plugin build cannot read claims from the API yet")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = load(
            PluginSettings,
            argv=sys.argv[1:] if argv is None else argv,
            prog="neuron-dra-kubelet-plugin",
        )
    except SettingsError as exc:
        print(exc, file=sys.stderr)
        return 2
    kubelet_root = Path(settings.kubelet_root)
    paths = socket_paths(kubelet_root, pod_uid=settings.pod_uid or None)
    checkpoint = Path(settings.checkpoint_path or paths.dra.parent / "checkpoint.json")

    hardware = read_node(Path(settings.host_root))
    try:
        node = NodeContext.from_hardware(
            hardware, pool=settings.node_name, dev_root=str(Path(settings.host_root) / "dev")
        )
    except UnknownInstanceType as exc:
        print(f"node {settings.node_name}: {exc}", file=sys.stderr)
        return 1

    async def build() -> Service:
        preparer = NodePreparer(
            node=node,
            claims=_NoClaimSource(),
            effects=Effects(store=CheckpointStore(checkpoint), cdi_root=Path(settings.cdi_root)),
            boot_id=read_boot_id(),
        )
        preparer.recover()
        health = StaticHealth(
            pool=settings.node_name, devices=[device_name(i) for i in sorted(node.devices)]
        )
        service = Service(name=NAME, settings=settings)
        stopped = asyncio.Event()

        async def serving() -> None:
            async with serve(paths, preparer=preparer, health=health) as servers:
                service.add_readiness("registered", servers.registration.registered.is_set)
                with contextlib.suppress(asyncio.CancelledError):
                    await stopped.wait()

        service.add_task("grpc", serving, stop=stopped.set)
        return service

    return run(build, name=NAME, settings=settings)
