"""A simulated EFA DRA driver, for the local stack only: ``python -m neuron_dra_kubelet_plugin.efasim``.

The Neuron driver shares the nodes of an EKS cluster with AWS's EFA DRA driver (``dra.net``,
DeviceClass ``efa.networking.k8s.aws``, see :mod:`neuron_dra_common.efa`): a claim asks for
Neuron devices and the EFA interfaces beside them, and AWS's UltraServer guide requires EFA
for workloads of more than one UltraServer. The stack has no EFA hardware, so this process
stands in for that driver, and for nothing else: one process for every simulated node with
EFA interfaces, which

- installs the DeviceClass AWS's chart installs;
- publishes each node's ResourceSlice of driver ``dra.net`` (its EFA interfaces from the
  catalog, with the ``resource.aws.com/devicegroup*_id`` values the Neuron devices beside them
  carry);
- serves each node's kubelet through the same gRPC servers as the Neuron plugin
  (:func:`~neuron_dra_kubelet_plugin.servers.serve`, registered as ``dra.net``): prepare writes
  a CDI spec of kind ``dra.net/efa`` giving the container the interfaces' ``uverbs`` device
  nodes; unprepare removes it. Both are idempotent (the spec is the only state).

It moves no network interface and keeps no checkpoint: it simulates hardware so the real
scheduler and kubelet have a second driver to work with, and is never deployed to a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Final

import msgspec
from neuron_dra_common import cdi
from neuron_dra_common.driver import ANNOTATION_REQUESTS
from neuron_dra_common.efa import (
    EFA_CDI_KIND,
    EFA_DRIVER_NAME,
    EfaInterface,
    device_class,
    efa_interfaces,
    slice_devices,
)
from neuron_dra_common.settings import ServiceSettings
from neuron_dra_common.topology import UnknownInstanceType

from neuron_dra_kubelet_plugin.checkpoint import PreparedDevice
from neuron_dra_kubelet_plugin.claims import ClaimRef, parent_request
from neuron_dra_kubelet_plugin.plan import PrepareError
from neuron_dra_kubelet_plugin.preparer import ClaimSource

__all__ = [
    "NAME",
    "EfaPreparer",
    "EfaSimSettings",
    "SimNode",
    "main",
    "resource_slice",
]

NAME: Final = "efa-simulator"
#: The field manager of everything this process writes.
MANAGER: Final = "neuron-dra-efa-simulator"
_CDI_VERSION: Final = "1.1.0"


class SimNode(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One simulated node this process serves (a line of the stack's nodes file)."""

    name: str
    instance_type: str
    kubelet_root: str
    cdi_root: str
    dev_root: str


class EfaSimSettings(ServiceSettings, frozen=True, kw_only=True):
    """Simulates AWS's EFA DRA driver (``dra.net``) on the local stack's nodes."""

    nodes_file: Annotated[
        str,
        msgspec.Meta(
            min_length=1, description="JSON list of the nodes to serve (the stack writes it)"
        ),
    ]
    kubeconfig: Annotated[str, msgspec.Meta(description="kubeconfig file; empty: $KUBECONFIG")] = ""

    def bus_refusal(self) -> str:
        return ""  # it never connects to the bus


def resource_slice(node: SimNode) -> dict[str, Any]:
    """The node's ``dra.net`` ResourceSlice (``resource.k8s.io/v1``), one per node.

    >>> s = resource_slice(SimNode(name="n1", instance_type="trn2.48xlarge",
    ...     kubelet_root="/k", cdi_root="/c", dev_root="/d"))
    >>> s["spec"]["driver"], len(s["spec"]["devices"])
    ('dra.net', 16)
    """
    return {
        "metadata": {"name": f"{node.name}-{EFA_DRIVER_NAME}"},
        "spec": {
            "driver": EFA_DRIVER_NAME,
            "nodeName": node.name,
            "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
            "devices": slice_devices(node.instance_type),
        },
    }


class EfaPreparer:
    """A :class:`~neuron_dra_kubelet_plugin.preparer.Preparer` of one node's EFA interfaces."""

    def __init__(self, node: SimNode, *, claims: ClaimSource) -> None:
        self._node = node
        self._claims = claims
        self._interfaces: dict[str, EfaInterface] = {
            i.name: i for i in efa_interfaces(node.instance_type)
        }
        self._cdi_root = Path(node.cdi_root)

    async def prepare(self, ref: ClaimRef) -> tuple[PreparedDevice, ...]:
        claim = await self._claims.get(ref)
        if claim is None:
            raise PrepareError(f"{ref}: not found in the API")
        if claim.metadata.uid != ref.uid:
            raise PrepareError(f"{ref}: the API has UID {claim.metadata.uid}, not {ref.uid}")
        allocation = claim.status.allocation
        if allocation is None:
            raise PrepareError(f"{ref}: not allocated")
        requests: dict[str, list[str]] = {}
        for r in allocation.devices.results:
            if r.driver != EFA_DRIVER_NAME:
                continue
            if r.pool != self._node.name or r.device not in self._interfaces:
                raise PrepareError(
                    f"{ref}: device {r.pool}/{r.device} is not an EFA interface of node "
                    f"{self._node.name}"
                )
            requests.setdefault(r.device, []).append(parent_request(r.request))
        devices = []
        prepared = []
        for name, names in requests.items():
            iface = self._interfaces[name]
            cdi_name = cdi.claim_device_name(ref.uid, name)
            path = f"/dev/infiniband/{iface.uverbs}"
            devices.append(
                cdi.Device(
                    name=cdi_name,
                    container_edits=cdi.ContainerEdits(
                        device_nodes=(
                            cdi.DeviceNode(
                                path=path,
                                host_path=f"{self._node.dev_root}/infiniband/{iface.uverbs}",
                            ),
                        )
                    ),
                    annotations={ANNOTATION_REQUESTS: ",".join(dict.fromkeys(names))},
                )
            )
            prepared.append(
                PreparedDevice(
                    request_names=tuple(dict.fromkeys(names)),
                    pool=self._node.name,
                    device=name,
                    cdi_device_ids=(cdi.qualified_device_id(cdi_name, EFA_CDI_KIND),),
                )
            )
        if devices:
            spec = cdi.Spec(cdi_version=_CDI_VERSION, kind=EFA_CDI_KIND, devices=tuple(devices))
            cdi.write_claim_spec(self._cdi_root, ref.uid, spec)
        return tuple(prepared)

    async def unprepare(self, ref: ClaimRef) -> None:
        cdi.remove_claim_spec(self._cdi_root, ref.uid, EFA_CDI_KIND)


def load_nodes(path: Path) -> tuple[SimNode, ...]:
    """The nodes file, a JSON list of :class:`SimNode`; a bad one names its field."""
    try:
        nodes = msgspec.json.decode(path.read_bytes(), type=tuple[SimNode, ...])
    except (OSError, msgspec.DecodeError) as exc:
        raise ValueError(f"nodes file {path}: {exc}") from None
    for i, node in enumerate(nodes):
        try:
            efa_interfaces(node.instance_type)
        except UnknownInstanceType as exc:
            raise ValueError(f"nodes file {path}: $[{i}].instanceType: {exc}") from None
    return nodes


def main(argv: Sequence[str] | None = None) -> int:
    """Serve every node of the nodes file until stopped."""
    from neuron_dra_common.settings import SettingsError, load

    prog = "python -m neuron_dra_kubelet_plugin.efasim"
    try:
        settings = load(EfaSimSettings, argv=sys.argv[1:] if argv is None else argv, prog=prog)
        nodes = load_nodes(Path(settings.nodes_file))
    except (SettingsError, ValueError) as exc:
        print(f"{NAME}: {exc}", file=sys.stderr)
        return 2

    from neuron_dra_common.kube import RESOURCE_SLICES, Resource, apply, connect
    from neuron_dra_common.runtime.process import Service, run

    from neuron_dra_kubelet_plugin.claimsource import ApiClaimSource
    from neuron_dra_kubelet_plugin.health import StaticHealth
    from neuron_dra_kubelet_plugin.registration import socket_paths
    from neuron_dra_kubelet_plugin.servers import serve

    device_classes = Resource(
        group="resource.k8s.io", version="v1", plural="deviceclasses", kind="DeviceClass"
    )

    async def wire() -> Service:
        client = await connect(kubeconfig=settings.kubeconfig or None)
        service = Service(name=NAME, settings=settings)
        service.on_shutdown(client.close)
        stopped = asyncio.Event()
        registered: list[asyncio.Event] = []

        async def serving() -> None:
            klass = {k: v for k, v in device_class().items() if k not in ("apiVersion", "kind")}
            await apply(client, device_classes, klass, field_manager=MANAGER)
            for node in nodes:
                await apply(client, RESOURCE_SLICES, resource_slice(node), field_manager=MANAGER)
            source = ApiClaimSource(client)
            async with contextlib.AsyncExitStack() as stack:
                for node in nodes:
                    servers = await stack.enter_async_context(
                        serve(
                            socket_paths(Path(node.kubelet_root), driver=EFA_DRIVER_NAME),
                            preparer=EfaPreparer(node, claims=source),
                            health=StaticHealth(
                                pool=node.name,
                                devices=[i.name for i in efa_interfaces(node.instance_type)],
                            ),
                            driver=EFA_DRIVER_NAME,
                        )
                    )
                    registered.append(servers.registration.registered)
                await stopped.wait()

        service.add_readiness(
            "registered",
            lambda: len(registered) == len(nodes) and all(e.is_set() for e in registered),
        )
        service.add_task("grpc", serving, stop=stopped.set)
        return service

    return run(wire, name=NAME, settings=settings)


if __name__ == "__main__":
    sys.exit(main())
