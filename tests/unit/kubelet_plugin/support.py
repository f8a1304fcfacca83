"""Claims and nodes for the kubelet plugin tests, shaped as the API and discovery give them."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from neuron_dra_common.driver import NODE_DEVICE
from neuron_dra_common.events.base import Event
from neuron_dra_common.topology import instance_spec
from neuron_dra_kubelet_plugin.checkpoint import CheckpointStore
from neuron_dra_kubelet_plugin.claims import ClaimRef, ResourceClaim, claim_from_api
from neuron_dra_kubelet_plugin.observe import ClaimEvents, EventSink
from neuron_dra_kubelet_plugin.plan import NodeContext
from neuron_dra_kubelet_plugin.preparer import Effects, NodePreparer
from neuron_dra_kubelet_plugin.told import ToldLedger

NODE = "ip-10-0-0-1.ec2.internal"


def trn2_node(*, pool: str = NODE, default_lnc: int | None = None) -> NodeContext:
    return NodeContext(
        pool=pool,
        instance=instance_spec("trn2.48xlarge"),
        devices=frozenset(range(16)),
        default_lnc=default_lnc,
        supported_ultraserver_modes=(1, 3, 4),
    )


def trn2u_node(*, pool: str = NODE) -> NodeContext:
    """An UltraServer node: its 16 devices and the whole-node device ``neuronnode``."""
    return NodeContext(
        pool=pool,
        instance=instance_spec("trn2u.48xlarge"),
        devices=frozenset(range(16)),
        supported_ultraserver_modes=(1, 3, 4),
        node_device=NODE_DEVICE,
    )


def claim_json(
    uid: str,
    devices: Sequence[int | str],
    *,
    name: str | None = None,
    namespace: str = "default",
    pool: str = NODE,
    request: str = "neurons",
    config: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """A ResourceClaim as the API returns it, allocated ``devices`` of ``pool``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name or f"claim-{uid}", "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": [{"name": request.split("/")[0]}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": request,
                            "driver": "neuron.aws.com",
                            "pool": pool,
                            "device": d if isinstance(d, str) else f"neurondevice{d}",
                        }
                        for d in devices
                    ],
                    "config": list(config),
                },
                "nodeSelector": {"nodeSelectorTerms": []},
            }
        },
    }


def make_claim(uid: str, devices: Sequence[int | str], **kwargs: Any) -> ResourceClaim:
    return claim_from_api(claim_json(uid, devices, **kwargs))


def ref_of(claim: ResourceClaim) -> ClaimRef:
    return ClaimRef(
        namespace=claim.metadata.namespace, name=claim.metadata.name, uid=claim.metadata.uid
    )


def opaque(
    kind: str, *, source: str = "FromClaim", requests: Sequence[str] = (), **fields: Any
) -> dict[str, Any]:
    """An allocation config entry for neuron.aws.com."""
    return {
        "source": source,
        "requests": list(requests),
        "opaque": {
            "driver": "neuron.aws.com",
            "parameters": {"apiVersion": "neuron.aws.com/v1", "kind": kind, **fields},
        },
    }


class MemoryClaims:
    """A :class:`ClaimSource` over a dict, standing in for the informer cache."""

    def __init__(self, claims: Sequence[ResourceClaim] = ()) -> None:
        self.claims = {c.metadata.uid: c for c in claims}

    def add(self, claim: ResourceClaim) -> None:
        self.claims[claim.metadata.uid] = claim

    async def get(self, ref: ClaimRef) -> ResourceClaim | None:
        claim = self.claims.get(ref.uid)
        if claim is None or claim.metadata.name != ref.name:
            return None
        return claim


TOLD_CLAIM = make_claim("u1", [0, 1, 2, 3], name="c1")


class Killed(Exception):
    """The process stops here (the test's stand-in for SIGKILL)."""


class IdSink:
    """A bus that keeps the msg ids it is given."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    async def publish_many(
        self, events: Sequence[Event], *, msg_ids: Sequence[str] | None = None
    ) -> object:
        assert msg_ids is not None
        self.ids += msg_ids
        return None


class TellingProcess:
    """One plugin process on a trn2 node with claim :data:`TOLD_CLAIM`: its preparer, and
    the events it told (ids kept in the ledger beside its checkpoint under ``root``)."""

    def __init__(self, root: Path, *, dies_at: str = "", boot: str = "b1") -> None:
        def crash(step: str) -> None:
            if step == dies_at:
                raise Killed(step)

        self.events = ClaimEvents(
            node="n1", boot_id=boot, ledger=ToldLedger(root / "told.json", boot_id=boot)
        )
        self.preparer = NodePreparer(
            node=trn2_node(),
            claims=MemoryClaims([TOLD_CLAIM]),
            effects=Effects(store=CheckpointStore(root / "checkpoint.json"), cdi_root=root / "cdi"),
            boot_id=boot,
            listener=self.events,
            crash=crash,
        )
        self.preparer.recover()

    async def prepare(self) -> None:
        await self.preparer.prepare(ref_of(TOLD_CLAIM))

    async def unprepare(self) -> None:
        await self.preparer.unprepare(ref_of(TOLD_CLAIM))

    async def told(self) -> list[str]:
        """The ids of what this process queued, in order (as they would be published)."""
        sink = IdSink()
        await self.publish(sink)
        return sink.ids

    async def publish(self, sink: EventSink) -> None:
        """Publish what is queued through ``sink``; the process's events end."""
        self.events.attach(sink)
        self.events.stop()
        await asyncio.wait_for(self.events.run(), 5)
