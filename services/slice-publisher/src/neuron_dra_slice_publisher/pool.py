"""What to write so that the stored pool of a node matches its content (no I/O).

A pool is replaced as a whole: when anything differs, every slice is written again under the
next generation and the slices that are no longer needed are deleted afterwards. Consumers use
only the highest generation and wait until ``resourceSliceCount`` slices of it are visible,
so a reader never mixes two versions of a node. When the stored slices already match (same
names, one generation, the content digests in their annotation, the same owner) nothing is
written at all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Final

import msgspec
from neuron_dra_common.driver import DRIVER_NAME as DRIVER

from neuron_dra_slice_publisher.slices import PoolContent, SliceContent, content_hash

__all__ = [
    "CONTENT_ANNOTATION",
    "MANAGED_BY",
    "NODE_LABEL",
    "POOL_ANNOTATION",
    "NodeRef",
    "Plan",
    "StoredSlice",
    "Write",
    "label_value",
    "plan_pool",
    "pool_is_current",
    "render_slice",
    "slice_name",
    "slice_summary",
    "stored_slice",
]

API_VERSION: Final = "resource.k8s.io/v1"
CONTENT_ANNOTATION: Final = "neuron.aws.com/content-hash"
#: ``<pool generation>/<resourceSliceCount>``: the pool's place in metadata, so the slice
#: informer can watch metadata only (a slice's devices are most of its bytes).
POOL_ANNOTATION: Final = "neuron.aws.com/pool"
NODE_LABEL: Final = "neuron.aws.com/node"
MANAGED_BY: Final = "neuron-dra-slice-publisher"
_MAX_NAME: Final = 253


class NodeRef(msgspec.Struct, frozen=True, kw_only=True):
    """The Node a pool belongs to (its slices are owned by it and go when it goes)."""

    name: str
    uid: str


class StoredSlice(msgspec.Struct, frozen=True, kw_only=True):
    """What the publisher needs to know of a slice already in the API."""

    name: str
    pool: str
    generation: int
    slice_count: int
    content_hash: str
    owner_uid: str
    resource_version: str


class Write(msgspec.Struct, frozen=True, kw_only=True):
    """Create (``resource_version`` empty) or replace one slice."""

    name: str
    body: dict[str, Any]
    resource_version: str = ""


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """The writes (in order), then the deletes, that make the stored pool current."""

    node: str
    generation: int
    writes: tuple[Write, ...] = ()
    deletes: tuple[str, ...] = ()

    @property
    def unchanged(self) -> bool:
        return not self.writes and not self.deletes


def slice_name(node: str, index: int) -> str:
    """``<node>-neuron.aws.com-<index>``; very long node names are shortened with a digest."""
    name = f"{node}-{DRIVER}-{index}"
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    keep = _MAX_NAME - len(f"-{digest}-{DRIVER}-{index}")
    return f"{node[:keep].rstrip('.-')}-{digest}-{DRIVER}-{index}"


def render_slice(
    content: SliceContent,
    *,
    owner: NodeRef,
    index: int,
    generation: int,
    count: int,
    digest: str = "",
) -> dict[str, Any]:
    """The full ``resource.k8s.io/v1`` ResourceSlice object for slice ``index`` of a pool.

    ``digest`` is ``content_hash(content)`` when the caller has it already.
    """
    spec: dict[str, Any] = {
        "driver": DRIVER,
        "nodeName": owner.name,
        "pool": {"name": owner.name, "generation": generation, "resourceSliceCount": count},
    }
    if content.shared_counters:
        spec["sharedCounters"] = [dict(c) for c in content.shared_counters]
    else:
        spec["devices"] = [dict(d) for d in content.devices]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(owner.name, index),
            "labels": {
                NODE_LABEL: label_value(owner.name),
                "app.kubernetes.io/managed-by": MANAGED_BY,
            },
            "annotations": {
                CONTENT_ANNOTATION: digest or content_hash(content),
                POOL_ANNOTATION: f"{generation}/{count}",
            },
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": owner.name, "uid": owner.uid}
            ],
        },
        "spec": spec,
    }


def label_value(node: str) -> str:
    # Label values stop at 63 characters; longer node names are found by their digest.
    if len(node) <= 63:
        return node
    return hashlib.sha256(node.encode()).hexdigest()[:63]


def slice_summary(obj: dict[str, Any]) -> dict[str, Any]:
    """What the slice informer keeps of a ResourceSlice: its metadata (field managers left
    out) and pool; the devices are this publisher's own output and never read back."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    spec = obj.get("spec") or {}
    kept = {k: spec[k] for k in ("driver", "nodeName", "pool") if k in spec}
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": meta,
        "spec": kept,
    }


def stored_slice(obj: dict[str, Any]) -> StoredSlice:
    """Read what matters of a ResourceSlice: a full object, or its metadata only.

    The pool comes from the spec when there is one, else from the owning Node and
    :data:`POOL_ANNOTATION` (every slice this publisher writes carries both).
    """
    meta = obj.get("metadata", {})
    annotations = meta.get("annotations") or {}
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("kind") == "Node"]
    pool = (obj.get("spec") or {}).get("pool")
    if pool is not None:
        name = pool.get("name", "")
        generation = int(pool.get("generation", 0))
        count = int(pool.get("resourceSliceCount", 0))
    else:
        name = owners[0].get("name", "") if owners else ""
        generation, count = _pool_annotation(annotations.get(POOL_ANNOTATION, ""))
    return StoredSlice(
        name=meta.get("name", ""),
        pool=name,
        generation=generation,
        slice_count=count,
        content_hash=annotations.get(CONTENT_ANNOTATION, ""),
        owner_uid=owners[0].get("uid", "") if owners else "",
        resource_version=meta.get("resourceVersion", ""),
    )


def _pool_annotation(value: str) -> tuple[int, int]:
    generation, _, count = value.partition("/")
    if generation.isdigit() and count.isdigit():
        return int(generation), int(count)
    return 0, 0  # not ours, or edited: the next reconcile writes the pool again


def pool_is_current(
    digests: Sequence[str], *, owner: NodeRef, stored: Sequence[StoredSlice]
) -> bool:
    """``stored`` already is the pool whose slices have ``digests`` (in order): the same
    names, one generation, each slice's content digest, slice count and owner."""
    count = len(digests)
    by_name = {s.name: s for s in stored}
    if len(by_name) != count or len({s.generation for s in stored}) != 1:
        return False
    for index, digest in enumerate(digests):
        held = by_name.get(slice_name(owner.name, index))
        if (
            held is None
            or held.content_hash != digest
            or held.slice_count != count
            or held.owner_uid != owner.uid
        ):
            return False
    return True


def plan_pool(
    content: PoolContent | None,
    *,
    owner: NodeRef,
    stored: Sequence[StoredSlice],
    digests: Sequence[str] | None = None,
) -> Plan:
    """The writes and deletes that turn ``stored`` into ``content`` (``None``: no pool).

    ``digests`` are ``content_hash`` of each of ``content.slices`` when the caller has them.
    """
    by_name = {s.name: s for s in stored}
    top = max((s.generation for s in stored), default=0)
    if content is None or not content.slices:
        return Plan(node=owner.name, generation=top, deletes=tuple(sorted(by_name)))
    count = len(content.slices)
    if digests is None:
        digests = [content_hash(part) for part in content.slices]
    if pool_is_current(digests, owner=owner, stored=stored):
        return Plan(node=owner.name, generation=top)
    wanted = [(slice_name(owner.name, i), digest) for i, digest in enumerate(digests)]
    generation = top + 1
    writes = tuple(
        Write(
            name=name,
            body=render_slice(
                part, owner=owner, index=i, generation=generation, count=count, digest=digest
            ),
            resource_version=by_name[name].resource_version if name in by_name else "",
        )
        for i, ((name, digest), part) in enumerate(zip(wanted, content.slices, strict=True))
    )
    keep = {name for name, _ in wanted}
    return Plan(
        node=owner.name,
        generation=generation,
        writes=writes,
        deletes=tuple(sorted(set(by_name) - keep)),
    )
