"""NeuronUltraServer reconcile: one object per discovered UltraServer, kept current.

Spec (members, link status) comes from discovery; status (health, allocations, state) from
discovery and every workload's recorded allocations, so it is derived, never edited in place.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from neuron_dra_common.kube import ApiException, KubeClient, apply, apply_status
from neuron_dra_common.ultraserver import NAMESPACE

from neuron_dra_ultraserver_operator.discovery import UltraServerView
from neuron_dra_ultraserver_operator.manifests import ultraserver_object, ultraserver_status
from neuron_dra_ultraserver_operator.model import FIELD_MANAGER, Workload, workload_from_api
from neuron_dra_ultraserver_operator.resources import NAMESPACES, NUS
from neuron_dra_ultraserver_operator.statuses import stamp

__all__ = ["UltraServerReconciler", "ensure_namespace"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]


async def ensure_namespace(client: KubeClient) -> None:
    await apply(client, NAMESPACES, {"metadata": {"name": NAMESPACE}}, field_manager=FIELD_MANAGER)


class UltraServerReconciler:
    def __init__(
        self,
        *,
        client: KubeClient,
        objects: Mapping[str, Obj],
        workloads: Mapping[str, Obj],
        fleet: Callable[[], Mapping[str, UltraServerView]],
        failed: Mapping[str, str] | None = None,
    ) -> None:
        self.client = client
        self._objects = objects
        self._workloads = workloads
        self._fleet = fleet
        #: node -> why it failed (lost, a failed device), from the health stream
        self._failed: Mapping[str, str] = failed if failed is not None else {}
        self._decoded: dict[str, tuple[str, Workload | None]] = {}

    def _all_workloads(self) -> list[Workload]:
        # Every NeuronUltraServer's status reads every workload: decode each version once.
        out = []
        seen: dict[str, tuple[str, Workload | None]] = {}
        for key, obj in list(self._workloads.items()):
            version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            cached = self._decoded.get(key)
            if cached is None or cached[0] != version or not version:
                try:
                    cached = (version, workload_from_api(obj))
                except msgspec.ValidationError:
                    cached = (version, None)
            seen[key] = cached
            if cached[1] is not None:
                out.append(cached[1])
        self._decoded = seen
        return out

    async def reconcile(self, name: str) -> None:
        view = self._fleet().get(name)
        existing = self._objects.get(f"{NAMESPACE}/{name}")
        workloads = self._all_workloads()
        if view is None:
            held = any(r.ultra_server == name for w in workloads for r in w.status.allocations)
            if existing is not None and not held:
                try:
                    await self.client.delete(NUS, name, namespace=NAMESPACE)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
            return
        desired = ultraserver_object(view)
        if (
            existing is None
            or any((existing.get(k) or {}) != v for k, v in (("spec", desired["spec"]),))
            or ((existing.get("metadata") or {}).get("labels") or {})
            != desired["metadata"]["labels"]
        ):
            existing = await apply(self.client, NUS, desired, field_manager=FIELD_MANAGER)
        generation = int((existing.get("metadata") or {}).get("generation") or 1)
        status = ultraserver_status(
            view,
            workloads,
            generation=generation,
            failed={
                m.node_name: self._failed[m.node_name]
                for m in view.members
                if m.node_name in self._failed
            },
            previous=existing.get("status") or {},
            now=stamp(),
        )
        if (existing.get("status") or {}) != status:
            await apply_status(
                self.client,
                NUS,
                {"metadata": {"name": name, "namespace": NAMESPACE}, "status": status},
                field_manager=FIELD_MANAGER,
            )
