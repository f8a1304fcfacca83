"""The kubelet's ``DRAPlugin`` service, v1 and v1beta1 (one servicer), over a :class:`Preparer`.

Every claim in a request gets an entry in the response. A claim that fails carries its
error in that entry; the call itself only fails if the request cannot be read at all,
because a gRPC error makes the kubelet retry every claim of the call. Claims of one call
are handled concurrently.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from types import ModuleType
from typing import Any

import grpc
import msgspec
from neuron_dra_common.grpcserver import Servable
from neuron_dra_protos.dra.v1 import dra_pb2 as v1
from neuron_dra_protos.dra.v1 import dra_pb2_grpc as v1_grpc
from neuron_dra_protos.dra.v1beta1 import dra_pb2 as v1beta1
from neuron_dra_protos.dra.v1beta1 import dra_pb2_grpc as v1beta1_grpc

from neuron_dra_kubelet_plugin.checkpoint import PreparedDevice
from neuron_dra_kubelet_plugin.claims import ClaimRef
from neuron_dra_kubelet_plugin.plan import PrepareError
from neuron_dra_kubelet_plugin.preparer import Preparer

__all__ = ["ClaimOutcome", "DraPlugin", "DraService", "dra_plugin_services"]

log = logging.getLogger(__name__)


class ClaimOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """The answer for one claim: its devices, or the error that stopped it."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


def _request_names(names: Sequence[str]) -> list[str]:
    # The kubelet matches containers to requests by the claim's request names, which never
    # carry the "/subrequest" suffix of a prioritized-list allocation.
    out: list[str] = []
    for name in names:
        parent = name.split("/", 1)[0]
        if parent not in out:
            out.append(parent)
    return out


class DraService:
    """Runs prepare/unprepare for every claim of a call and collects per-claim outcomes."""

    def __init__(self, preparer: Preparer) -> None:
        self._preparer = preparer

    async def _prepare_one(self, ref: ClaimRef) -> ClaimOutcome:
        try:
            return ClaimOutcome(devices=await self._preparer.prepare(ref))
        except PrepareError as exc:
            return ClaimOutcome(error=str(exc))
        except Exception as exc:
            log.exception("prepare of %s (%s) failed", ref, ref.uid)
            return ClaimOutcome(error=f"{ref}: internal error: {exc!r}")

    async def _unprepare_one(self, ref: ClaimRef) -> ClaimOutcome:
        try:
            await self._preparer.unprepare(ref)
            return ClaimOutcome()
        except PrepareError as exc:
            return ClaimOutcome(error=str(exc))
        except Exception as exc:
            log.exception("unprepare of %s (%s) failed", ref, ref.uid)
            return ClaimOutcome(error=f"{ref}: internal error: {exc!r}")

    async def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, ClaimOutcome]:
        """Outcome per claim UID."""
        if len(refs) == 1 and refs[0].uid and refs[0].name and refs[0].namespace:
            return {refs[0].uid: await self._prepare_one(refs[0])}  # the common call
        return await _each(refs, self._prepare_one)

    async def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, ClaimOutcome]:
        """Outcome per claim UID."""
        if len(refs) == 1 and refs[0].uid and refs[0].name and refs[0].namespace:
            return {refs[0].uid: await self._unprepare_one(refs[0])}  # the common call
        return await _each(refs, self._unprepare_one)


async def _each(
    refs: Sequence[ClaimRef], run: Callable[[ClaimRef], Awaitable[ClaimOutcome]]
) -> dict[str, ClaimOutcome]:
    """``run`` for every claim the request names properly, concurrently; an error for the rest.

    The response has one entry per UID, so a claim without a UID, or two different claims
    under one UID, cannot be answered for each: they are refused rather than have one
    claim's answer stand for another's (or a claim prepared under an empty UID). The same
    claim named twice is run once.
    """
    refused: dict[str, ClaimOutcome] = {}
    by_uid: dict[str, ClaimRef] = {}
    for ref in refs:
        missing = [f for f in ("namespace", "name", "uid") if not getattr(ref, f)]
        if missing:
            error = f"{ref}: the request names no claim {' or '.join(missing)}"
            refused.setdefault(ref.uid, ClaimOutcome(error=error))
        elif ref.uid in by_uid and by_uid[ref.uid] != ref:
            error = f"{ref}: UID {ref.uid} is also given to {by_uid[ref.uid]} in this request"
            refused[ref.uid] = ClaimOutcome(error=error)
        else:
            by_uid[ref.uid] = ref
    todo = [ref for uid, ref in by_uid.items() if uid not in refused]
    outcomes = await asyncio.gather(*(run(ref) for ref in todo))
    return {**dict(zip((r.uid for r in todo), outcomes, strict=True)), **refused}


def _refs(claims: Sequence[v1.Claim] | Sequence[v1beta1.Claim]) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]


class DraPlugin:
    """``k8s.io.kubelet.pkg.apis.dra.<version>.DRAPlugin`` for v1 and v1beta1 alike.

    Both versions carry the same messages under the same field numbers (v1 adds a share id,
    which this driver never sets), so one servicer answers both; ``messages`` is the
    version's generated message module and builds the responses. :class:`DraPluginV1` and
    :class:`DraPluginV1beta1` only add the version's method names.
    """

    def __init__(self, service: DraService, *, messages: ModuleType) -> None:
        self._service = service
        self._messages = messages

    async def NodePrepareResources(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        return await self.prepare(request)

    async def NodeUnprepareResources(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        return await self.unprepare(request)

    async def prepare(
        self, request: v1.NodePrepareResourcesRequest | v1beta1.NodePrepareResourcesRequest
    ) -> Any:
        """The response to one ``NodePrepareResources`` request."""
        outcomes = await self._service.prepare(_refs(request.claims))
        response = self._messages.NodePrepareResourcesResponse()
        for uid, outcome in outcomes.items():
            entry = response.claims[uid]
            entry.error = outcome.error
            for d in outcome.devices:
                entry.devices.append(
                    self._messages.Device(
                        request_names=_request_names(d.request_names),
                        pool_name=d.pool,
                        device_name=d.device,
                        cdi_device_ids=list(d.cdi_device_ids),
                    )
                )
        return response

    async def unprepare(
        self, request: v1.NodeUnprepareResourcesRequest | v1beta1.NodeUnprepareResourcesRequest
    ) -> Any:
        """The response to one ``NodeUnprepareResources`` request."""
        outcomes = await self._service.unprepare(_refs(request.claims))
        response = self._messages.NodeUnprepareResourcesResponse()
        for uid, outcome in outcomes.items():
            response.claims[uid].error = outcome.error
        return response


class DraPluginV1(DraPlugin, v1_grpc.DRAPluginServicer):
    """The servicer under the v1 service name."""


class DraPluginV1beta1(DraPlugin, v1beta1_grpc.DRAPluginServicer):
    """The servicer under the v1beta1 service name."""


def dra_plugin_services(service: DraService) -> list[Servable]:
    """The one servicer under both versions' service names."""
    return [
        Servable(v1_grpc.add_DRAPluginServicer_to_server, DraPluginV1(service, messages=v1)),
        Servable(
            v1beta1_grpc.add_DRAPluginServicer_to_server,
            DraPluginV1beta1(service, messages=v1beta1),
        ),
    ]
