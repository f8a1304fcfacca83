"""The part of a ``resource.k8s.io/v1`` ResourceClaim the plugin reads, as frozen Structs.

Decoded from the API's JSON (camelCase) with unknown fields ignored, so a newer apiserver
that adds fields does not break the plugin. Only what prepare needs is modelled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

__all__ = [
    "Allocation",
    "AllocationConfig",
    "ClaimRef",
    "ClaimStatus",
    "ConsumerRef",
    "DeviceAllocation",
    "DeviceResult",
    "ObjectMeta",
    "OpaqueConfig",
    "ResourceClaim",
    "claim_from_api",
    "parent_request",
]


class ClaimRef(msgspec.Struct, frozen=True, kw_only=True):
    """A claim as the kubelet names it in NodePrepareResources / NodeUnprepareResources."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.name}"


class ObjectMeta(msgspec.Struct, frozen=True, kw_only=True):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    # The UltraServer operator's claims name their workload here (see ultraserver.py).
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    # The workload's trace context (``neuron.aws.com/traceparent``), copied from the template.
    annotations: dict[str, str] = msgspec.field(default_factory=dict)


class OpaqueConfig(msgspec.Struct, frozen=True, kw_only=True):
    driver: str
    # Whatever the user wrote; decoded strictly per kind in config.py.
    parameters: Any = None


class AllocationConfig(msgspec.Struct, frozen=True, kw_only=True):
    """``status.allocation.devices.config[]``: ``source`` is ``FromClass`` or ``FromClaim``."""

    source: str = ""
    requests: tuple[str, ...] = ()
    opaque: OpaqueConfig | None = None


class DeviceResult(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One allocated device: ``request`` is ``req`` or ``req/subrequest``."""

    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool | None = None
    share_id: str | None = msgspec.field(default=None, name="shareID")


class DeviceAllocation(msgspec.Struct, frozen=True, kw_only=True):
    results: tuple[DeviceResult, ...] = ()
    config: tuple[AllocationConfig, ...] = ()


class Allocation(msgspec.Struct, frozen=True, kw_only=True):
    devices: DeviceAllocation = msgspec.field(default_factory=DeviceAllocation)
    # RFC 3339, set by kube-scheduler 1.36 when it allocates (not by 1.34): when it happened.
    allocation_timestamp: str = msgspec.field(default="", name="allocationTimestamp")


class ConsumerRef(msgspec.Struct, frozen=True, kw_only=True):
    """``status.reservedFor[]``: who uses the claim (a Pod, usually)."""

    resource: str = ""
    name: str = ""
    uid: str = ""


class ClaimStatus(msgspec.Struct, frozen=True, kw_only=True):
    allocation: Allocation | None = None
    reserved_for: tuple[ConsumerRef, ...] = msgspec.field(default=(), name="reservedFor")


class ResourceClaim(msgspec.Struct, frozen=True, kw_only=True):
    metadata: ObjectMeta
    status: ClaimStatus = msgspec.field(default_factory=ClaimStatus)

    def __str__(self) -> str:
        return f"ResourceClaim {self.metadata.namespace}/{self.metadata.name}"


def claim_from_api(obj: Mapping[str, Any]) -> ResourceClaim:
    """Decode a ResourceClaim as the API returns it (JSON object, camelCase keys).

    Raises :class:`msgspec.ValidationError` naming the path of a field of the wrong type.
    """
    return msgspec.convert(obj, type=ResourceClaim)


def parent_request(request: str) -> str:
    """The claim request a result belongs to: ``req/sub`` -> ``req``, ``req`` -> ``req``.

    >>> parent_request("neurons/four")
    'neurons'
    """
    return request.split("/", 1)[0]
