"""Server-side apply with one field manager per service."""

from __future__ import annotations

from typing import Any

from neuron_dra_common.kube.client import KubeClient, Resource

__all__ = ["apply", "apply_status"]

Obj = dict[str, Any]


def _target(resource: Resource, obj: Obj) -> tuple[str | None, str]:
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not name:
        raise ValueError(f"{resource.kind or resource.plural}: metadata.name is required to apply")
    namespace = meta.get("namespace") if resource.namespaced else None
    if resource.namespaced and not namespace:
        raise ValueError(f"{resource.kind} {name}: metadata.namespace is required to apply")
    return namespace, name


async def apply(
    client: KubeClient,
    resource: Resource,
    obj: Obj,
    *,
    field_manager: str,
    force: bool = True,
    subresource: str | None = None,
) -> Obj:
    """Server-side apply ``obj`` as ``field_manager``; returns the object as stored.

    ``obj`` holds only the fields this manager owns: fields it stops sending are removed,
    fields other managers own are kept. ``force`` takes over conflicting fields, which is
    what a controller that is the sole writer of those fields wants.
    """
    namespace, name = _target(resource, obj)
    body = {"apiVersion": resource.api_version, "kind": resource.kind, **obj}
    return await client.patch(
        resource,
        name,
        body,
        namespace=namespace,
        subresource=subresource,
        kind="apply",
        field_manager=field_manager,
        force=force,
    )


async def apply_status(
    client: KubeClient, resource: Resource, obj: Obj, *, field_manager: str
) -> Obj:
    """Server-side apply to the status subresource (``obj`` carries metadata and status)."""
    return await apply(client, resource, obj, field_manager=field_manager, subresource="status")
