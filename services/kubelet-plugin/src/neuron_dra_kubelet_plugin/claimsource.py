"""Reading the claims the kubelet names, one GET each: this node's claims and no others.

The plugin does not watch ResourceClaims. The apiserver can select claims only by name and
namespace (nothing says which node a claim is allocated on), so a watch would bring every
claim of the cluster to every node: at 10,000 nodes each claim change would be sent 10,000
times. The kubelet names the claims it wants prepared, right after the scheduler wrote
their allocation; a GET of each is always current, so no cache can be stale either. A
claim the API does not know (404) is ``None``.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import msgspec
from neuron_dra_common.kube import RESOURCE_CLAIMS, UNANSWERED, ApiException

from neuron_dra_kubelet_plugin.claims import ClaimRef, ResourceClaim, claim_from_api
from neuron_dra_kubelet_plugin.plan import PrepareError

__all__ = ["ApiClaimSource", "ClaimReader", "SourceStats"]

log = logging.getLogger(__name__)


class ClaimReader(Protocol):
    """The one API call the source makes (``KubeClient.get`` has this shape)."""

    async def get(self, resource: Any, name: str, *, namespace: str | None = None) -> Any: ...


class SourceStats(msgspec.Struct, kw_only=True):
    """How many claims were read, for metrics and tests."""

    api_reads: int = 0


class ApiClaimSource:
    """A :class:`~neuron_dra_kubelet_plugin.preparer.ClaimSource` over the Kubernetes API.

    >>> source = ApiClaimSource(client)
    >>> claim = await source.get(ClaimRef(namespace="default", name="pod0-neurons", uid="u1"))
    """

    def __init__(self, reader: ClaimReader) -> None:
        self._reader = reader
        self.stats = SourceStats()

    async def get(self, ref: ClaimRef) -> ResourceClaim | None:
        """The claim ``ref`` names, or ``None`` when the API has no claim of that name."""
        self.stats.api_reads += 1
        try:
            obj = await self._reader.get(RESOURCE_CLAIMS, ref.name, namespace=ref.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            # The kubelet retries a claim whose entry carries an error; say what failed.
            raise PrepareError(
                f"{ref}: reading it from the API failed: {exc.status} {exc.reason}"
            ) from exc
        except UNANSWERED as exc:
            raise PrepareError(f"{ref}: the API is unreachable: {exc!r}") from exc
        try:
            return claim_from_api(obj)
        except msgspec.ValidationError as exc:
            raise PrepareError(
                f"{ref}: the API returned a claim this plugin cannot read: {exc}"
            ) from exc
