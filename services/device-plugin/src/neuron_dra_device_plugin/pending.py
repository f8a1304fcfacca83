"""Which pod an Allocate call is for, by the scheduler extension's annotations. Pure.

The kubelet's Allocate names devices, not the pod. When the scheduler extension placed the
pod, it wrote the devices (or cores) it chose to the pod's annotations with
``NEURON_ALLOCATED: "false"``; the plugin serves those instead of what the kubelet picked, as
AWS's device plugin does. The pod is the oldest such pod on this node (by
``NEURON_ALLOC_TIME``) that asks for the same resource and the same number of units; once
served, its ``NEURON_ALLOCATED`` becomes ``"true"`` so no later call takes it again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
from neuron_dra_common.extended import (
    ANNOTATION_ALLOCATED,
    ANNOTATION_IDS,
    ANNOTATION_RESOURCE,
    ANNOTATION_TIME,
    CORE_RESOURCE,
    DEVICE_RESOURCE,
)

__all__ = ["Pending", "annotated_kind", "pick_pending"]

_TERMINAL = ("Succeeded", "Failed")


class Pending(msgspec.Struct, frozen=True, kw_only=True):
    """A pod waiting for the units the extension chose for it."""

    namespace: str
    name: str
    uid: str
    units: tuple[int, ...]
    allocated_at: int


def annotated_kind(resource: str) -> str:
    """The ``NEURON_RESOURCE_TYPE`` the extension writes for ``resource`` (both device names
    are annotated as ``aws.amazon.com/neuron``)."""
    return CORE_RESOURCE if resource == CORE_RESOURCE else DEVICE_RESOURCE


def _units(text: str) -> tuple[int, ...] | None:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        return None
    return tuple(sorted({int(p) for p in parts}))


def _pending(pod: Mapping[str, Any], *, kind: str) -> Pending | None:
    meta = pod.get("metadata") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    if (pod.get("status") or {}).get("phase") in _TERMINAL:
        return None
    if annotations.get(ANNOTATION_ALLOCATED) != "false":
        return None
    if annotations.get(ANNOTATION_RESOURCE, DEVICE_RESOURCE) != kind:
        return None
    units = _units(annotations.get(ANNOTATION_IDS, ""))
    if units is None:
        return None
    stamp = annotations.get(ANNOTATION_TIME, "")
    return Pending(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        units=units,
        allocated_at=int(stamp) if stamp.isdigit() else 0,
    )


def pick_pending(pods: Iterable[Mapping[str, Any]], *, resource: str, count: int) -> Pending | None:
    """The pod (of this node's ``pods``) an Allocate of ``count`` units of ``resource`` is for,
    or None when no annotated pod waits for that many.

    The kubelet allocates container by container while the extension annotates the whole
    pod, so the annotation is honoured for pods whose one Neuron container asks for it all.
    """
    kind = annotated_kind(resource)
    found = [p for pod in pods if (p := _pending(pod, kind=kind)) and len(p.units) == count]
    if not found:
        return None
    return min(found, key=lambda p: (p.allocated_at, p.namespace, p.name))
