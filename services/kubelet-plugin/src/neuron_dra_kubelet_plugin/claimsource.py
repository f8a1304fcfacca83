"""Reading the claims the kubelet names: the informer's cache first, the API when it lags.

The kubelet calls NodePrepareResources right after the scheduler wrote the allocation, so
the watch may not have delivered it yet. A cached claim is only trusted when it is the same
object (UID) and already allocated; anything else is read again with a GET, which is always
current. A claim the API does not know (404) is ``None``.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import msgspec
from neuron_dra_common.kube import RESOURCE_CLAIMS, ApiException

from neuron_dra_kubelet_plugin.claims import ClaimRef, ResourceClaim, claim_from_api
from neuron_dra_kubelet_plugin.plan import PrepareError

__all__ = ["ApiClaimSource", "ClaimCache", "ClaimReader", "SourceStats"]

log = logging.getLogger(__name__)


class ClaimReader(Protocol):
    """The one API call the source makes (``KubeClient.get`` has this shape)."""

    async def get(self, resource: Any, name: str, *, namespace: str | None = None) -> Any: ...


class ClaimCache(Protocol):
    """What the source reads of an informer: its cache and whether the first list is in."""

    @property
    def synced(self) -> bool: ...

    @property
    def cache(self) -> dict[str, dict[str, Any]]: ...


class SourceStats(msgspec.Struct, kw_only=True):
    """How claims were found, for metrics and tests."""

    cache_hits: int = 0
    api_reads: int = 0


class ApiClaimSource:
    """A :class:`~neuron_dra_kubelet_plugin.preparer.ClaimSource` over the Kubernetes API.

    >>> source = ApiClaimSource(client, cache=Informer(client, RESOURCE_CLAIMS))
    >>> claim = await source.get(ClaimRef(namespace="default", name="pod0-neurons", uid="u1"))
    """

    def __init__(self, reader: ClaimReader, *, cache: ClaimCache | None = None) -> None:
        self._reader = reader
        self._cache = cache
        self.stats = SourceStats()
        # Each version of a claim is decoded once (the kubelet asks again on every retry).
        self._decoded: dict[str, tuple[str, ResourceClaim]] = {}

    def _remember(self, key: str, version: str | None, claim: ResourceClaim) -> None:
        if not version or self._cache is None:
            return
        if len(self._decoded) > 2 * len(self._cache.cache) + 1024:
            live = self._cache.cache
            self._decoded = {k: v for k, v in self._decoded.items() if k in live}
        self._decoded[key] = (version, claim)

    def _cached(self, ref: ClaimRef) -> ResourceClaim | None:
        if self._cache is None or not self._cache.synced:
            return None
        key = f"{ref.namespace}/{ref.name}"
        obj = self._cache.cache.get(key)
        if obj is None:
            return None
        version = (obj.get("metadata") or {}).get("resourceVersion")
        known = self._decoded.get(key)
        if known is not None and version and known[0] == version:
            claim = known[1]
        else:
            try:
                claim = claim_from_api(obj)
            except msgspec.ValidationError:
                return None
            self._remember(key, version, claim)
        if claim.metadata.uid != ref.uid or claim.status.allocation is None:
            return None
        return claim

    async def get(self, ref: ClaimRef) -> ResourceClaim | None:
        """The claim ``ref`` names, or ``None`` when the API has no claim of that name."""
        cached = self._cached(ref)
        if cached is not None:
            self.stats.cache_hits += 1
            return cached
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
        except (TimeoutError, OSError) as exc:
            raise PrepareError(f"{ref}: the API is unreachable: {exc!r}") from exc
        try:
            return claim_from_api(obj)
        except msgspec.ValidationError as exc:
            raise PrepareError(
                f"{ref}: the API returned a claim this plugin cannot read: {exc}"
            ) from exc
