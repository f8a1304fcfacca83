"""An in-memory stand-in for the API server (workloads, Nodes, templates, Events) and a
world of UltraServers in which the workload reconciler runs, with the real allocator (its
placement and request handling, without the bus)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from neuron_dra_common.events import AnyEvent, Event, NodeLost
from neuron_dra_common.kube import ApiException
from neuron_dra_common.ultraserver import node_allocation, ultraserver_name
from neuron_dra_topology_allocator.allocator import Allocator
from neuron_dra_topology_allocator.projection import Projection
from neuron_dra_ultraserver_operator.discovery import Member, UltraServerView
from neuron_dra_ultraserver_operator.faults import CrashPoint, no_crash
from neuron_dra_ultraserver_operator.fleet import FleetIndex
from neuron_dra_ultraserver_operator.health import NodeHealth
from neuron_dra_ultraserver_operator.reconciler import WorkloadReconciler
from opentelemetry.trace import Tracer

Obj = dict[str, Any]
TYPE = "trn2u.48xlarge"
KEY = "ml/train"


class Sink:
    async def publish(self, event: Event, *, msg_id: str | None = None) -> Any:
        return None


class Api:
    """Just enough of the API server for the operator's writes."""

    def __init__(self, servers: int) -> None:
        self.nodes: dict[str, Obj] = {
            f"us{u}-n{i}": {
                "metadata": {"name": f"us{u}-n{i}", "annotations": {}, "resourceVersion": "1"},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            }
            for u in range(servers)
            for i in range(4)
        }
        self.workloads: dict[str, Obj] = {}
        self.templates: dict[str, Obj] = {}
        self.events: list[Obj] = []
        #: pod name -> pod; deleted ones are moved to ``deleted`` with their grace period
        self.pods: dict[str, Obj] = {}
        self.deleted: dict[str, int | None] = {}
        #: claim name -> claim (made from a template: its labels are the template's)
        self.claims: dict[str, Obj] = {}
        #: (method, path) of every request, in order
        self.calls: list[tuple[str, str]] = []
        #: Nodes whose writes fail (the apiserver answers 500), as if the operator died
        #: before they were made
        self.failing: set[str] = set()
        #: field manager -> the status fields and condition types its last apply sent
        self.status_owners: dict[str, tuple[set[str], set[str]]] = {}
        #: whether the EFA DeviceClass (efa.networking.k8s.aws) exists; ``None``: reading
        #: it is forbidden (403)
        self.efa_installed: bool | None = True

    def run_pods(self, template: str, nodes: list[str]) -> None:
        """One pod using ``template`` on each of ``nodes`` (what a Deployment would run),
        with the claim made from the template."""
        labels = ((self.templates.get(template) or {}).get("metadata") or {}).get("labels") or {}
        for node in nodes:
            claim = f"pod-{node}-n"
            self.claims[claim] = {"metadata": {"name": claim, "labels": dict(labels)}}
            self.pods[f"pod-{node}"] = {
                "metadata": {"name": f"pod-{node}", "namespace": "ml"},
                "spec": {
                    "nodeName": node,
                    "resourceClaims": [{"name": "n", "resourceClaimTemplateName": template}],
                },
                "status": {"resourceClaimStatuses": [{"name": "n", "resourceClaimName": claim}]},
            }

    async def list(
        self, resource: Any, *, namespace: str = "", label_selector: str = "", **kw: Any
    ) -> tuple[list[Obj], str]:
        if resource.plural == "pods":
            return list(self.pods.values()), "1"
        if resource.plural == "resourceclaims":
            key, _, value = label_selector.partition("=")
            return [
                c for c in self.claims.values() if c["metadata"]["labels"].get(key) == value
            ], "1"
        return [], "1"

    # The KubeClient verbs the operator calls, each routed as the request it makes.

    async def get(self, resource: Any, name: str, *, namespace: str | None = None) -> Obj:
        return await self.request("GET", resource.path(namespace=namespace, name=name))

    async def delete(
        self,
        resource: Any,
        name: str,
        *,
        namespace: str | None = None,
        uid: str = "",
        grace_period: int | None = None,
    ) -> Obj:
        body: Obj = {}
        if grace_period is not None:
            body["gracePeriodSeconds"] = grace_period
        if uid:
            body["preconditions"] = {"uid": uid}
        path = resource.path(namespace=namespace, name=name)
        return await self.request("DELETE", path, body=body)

    async def patch(
        self,
        resource: Any,
        name: str,
        patch: Obj,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        **kw: Any,
    ) -> Obj:
        path = resource.path(namespace=namespace, name=name, subresource=subresource)
        return await self.request("PATCH", path, body=patch, manager=kw.get("field_manager", ""))

    async def create(
        self, resource: Any, body: Obj, *, namespace: str | None = None, **kw: Any
    ) -> Obj:
        namespace = namespace or body.get("metadata", {}).get("namespace")
        return await self.request("POST", resource.path(namespace=namespace), body=body)

    async def post_event(
        self,
        involved: Mapping[str, str],
        *,
        reason: str,
        message: str,
        component: str,
        warning: bool = False,
        host: str = "",
    ) -> Obj:
        namespace = involved.get("namespace") or "default"
        body = {
            "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
            "involvedObject": dict(involved),
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": component},
        }
        return await self.request("POST", f"/api/v1/namespaces/{namespace}/events", body=body)

    async def request(self, method: str, path: str, **kw: Any) -> Obj:
        body: Obj = kw.get("body") or {}
        parts = path.strip("/").split("/")
        self.calls.append((method, path))
        if method == "DELETE" and "pods" in parts:
            self.pods.pop(parts[-1], None)
            self.deleted[parts[-1]] = body.get("gracePeriodSeconds")
        elif method == "DELETE" and "resourceclaimtemplates" in parts:
            self.templates.pop(parts[-1], None)
        elif method == "GET" and "resourceclaimtemplates" in parts:
            if parts[-1] not in self.templates:
                raise ApiException(404, "not found")
            return self.templates[parts[-1]]
        elif method == "POST" and parts[-1] == "events":
            self.events.append(body)
        elif method == "POST" and parts[-1] == "resourceclaimtemplates":
            name = body["metadata"]["name"]
            if name in self.templates:
                raise ApiException(409, "already exists")
            self.templates[name] = body
        elif method == "GET" and "deviceclasses" in parts:
            if self.efa_installed is None:
                raise ApiException(403, "forbidden")
            if not self.efa_installed:
                raise ApiException(404, "not found")
        elif method == "GET" and "nodes" in parts:
            return copy.deepcopy(self.nodes[parts[-1]])
        elif "nodes" in parts and parts[-1] in self.failing:
            raise ApiException(500, "internal error")
        elif "nodes" in parts:
            # A merge patch of the annotations (null removes one), refused when it names
            # another version than the Node's; it answers with the Node written.
            meta = self.nodes[parts[-1]]["metadata"]
            version = body["metadata"].get("resourceVersion")
            if version is not None and version != meta["resourceVersion"]:
                raise ApiException(409, "the object has been modified")
            notes = meta["annotations"]
            for key, value in (body["metadata"].get("annotations") or {}).items():
                if value is None:
                    notes.pop(key, None)
                else:
                    notes[key] = value
            self.touch(parts[-1])
            return copy.deepcopy(self.nodes[parts[-1]])
        elif "resourceclaimtemplates" in parts:
            self.templates[parts[-1]] = body
        elif "neuronultraserverworkloads" in parts:
            at = parts.index("neuronultraserverworkloads")
            wl = self.workloads[f"{parts[at - 1]}/{parts[at + 1]}"]
            if parts[-1] == "status":
                wl["status"] = self._applied(wl.get("status") or {}, body["status"], kw)
            else:
                wl["metadata"]["finalizers"] = body["metadata"].get("finalizers", [])
            # A new version, and the answer is the workload as stored.
            meta = wl["metadata"]
            meta["resourceVersion"] = str(int(meta.get("resourceVersion") or "1") + 1)
            return copy.deepcopy(wl)
        return body

    def _applied(self, current: Obj, sent: Obj, kw: Mapping[str, Any]) -> Obj:
        """A server-side apply of a status by one field manager: what it sends replaces what
        it sent last time; what other managers sent stays (conditions are a map by type)."""
        fields, types = self.status_owners.get(kw.get("manager", ""), (set(), set()))
        out = {k: v for k, v in current.items() if k != "conditions" and k not in fields}
        out |= {k: v for k, v in sent.items() if k != "conditions"}
        mine = {c["type"]: c for c in sent.get("conditions") or ()}
        conditions = [
            mine.pop(c["type"], c)
            for c in current.get("conditions") or ()
            if c["type"] in mine or c["type"] not in types
        ]
        out["conditions"] = conditions + list(mine.values())
        self.status_owners[kw.get("manager", "")] = (
            {k for k in sent if k != "conditions"},
            {c["type"] for c in sent.get("conditions") or ()},
        )
        return out

    def touch(self, node: str) -> None:
        """A write to the Node (any writer): a new resourceVersion."""
        meta = self.nodes[node]["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    def not_ready(self, node: str) -> None:
        self.nodes[node]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]

    def ready(self, node: str) -> None:
        self.nodes[node]["status"]["conditions"] = [{"type": "Ready", "status": "True"}]


def views(servers: int) -> dict[str, UltraServerView]:
    """What discovery makes of the fleet: the NeuronUltraServer is named after the raw server
    id the hardware reports (``us0`` -> ``us-us0``), and the allocator keys it by that name."""
    return {
        ultraserver_name(f"us{u}"): UltraServerView(
            name=ultraserver_name(f"us{u}"),
            server_id=f"us{u}",
            instance_type=TYPE,
            members=tuple(
                Member(
                    node_name=f"us{u}-n{i}",
                    node_id=i,
                    server_id_2=f"us{u}-p{i // 2}",
                    device_server_id=f"us{u}",
                    device_node_id=i,
                )
                for i in range(4)
            ),
        )
        for u in range(servers)
    }


class World:
    def __init__(
        self,
        servers: int,
        *,
        size: int,
        count: int,
        strategy: str,
        tracer: Tracer | None = None,
        on_allocate: Callable[[Event], None] = lambda event: None,
        node_cache: Callable[[Api], Mapping[str, Obj]] = lambda api: api.nodes,
        workload_cache: Callable[[Api], Mapping[str, Obj]] = lambda api: api.workloads,
        crash: CrashPoint = no_crash,
    ) -> None:
        self.api = Api(servers)
        projection = Projection()
        for u in range(servers):
            for i in range(4):
                projection.fleet.upsert_node(
                    f"us{u}-n{i}",
                    ultraserver=ultraserver_name(f"us{u}"),
                    instance_type=TYPE,
                    node_id=i,
                    server_id_2=f"us{u}-p{i // 2}",
                )
        projection.serving = True
        self.allocator = Allocator(projection, sink=Sink())
        self.api.workloads[KEY] = {
            "metadata": {
                "name": "train",
                "namespace": "ml",
                "uid": "uid-1",
                "generation": 1,
                "finalizers": [],
                "resourceVersion": "1",
            },
            "spec": {
                "instanceType": TYPE,
                "topologySize": size,
                "serverCount": count,
                "allocationPolicy": {"failureStrategy": strategy},
            },
        }
        _views = views(servers)
        self.projection = projection
        self.health = NodeHealth()

        async def allocate(event: Event) -> AnyEvent:
            on_allocate(event)
            return await self.allocator.handle(event)  # type: ignore[arg-type,return-value]

        #: Workloads the operator asked to reconcile again (by key), in order.
        self.requeued: list[str] = []
        #: Events the operator published (workload state changes), with their msg ids.
        self.published: list[tuple[Event, str]] = []

        async def publish(event: Event, msg_id: str) -> None:
            self.published.append((event, msg_id))

        def start(crash: CrashPoint) -> WorkloadReconciler:
            return WorkloadReconciler(
                client=self.api,  # type: ignore[arg-type]
                # The informers' copies of the workloads and Nodes (by default always current).
                workloads=workload_cache(self.api),
                nodes=node_cache(self.api),
                fleet=FleetIndex(lambda: _views, self.api.nodes, self.health),
                allocate=allocate,
                changed=lambda names: None,
                requeue=lambda key, after: self.requeued.append(key),
                released=lambda: None,
                tracer=tracer,
                publish=publish,
                crash=crash,
            )

        self._start = start
        self.reconciler = start(crash)

    def restart(self) -> None:
        """A new operator process (nothing remembered), without a crash point."""
        self.reconciler = self._start(no_crash)

    def lose(self, node: str) -> None:
        """The failure detector declares ``node`` lost (its Node still says Ready)."""
        event = NodeLost(node=node, detected_at=datetime.now(UTC), reason="no heartbeat for 3 s")
        self.health.apply(event)
        self.projection.apply(event)

    def reconcile(self) -> None:
        asyncio.run(self.reconciler.reconcile(KEY))

    @property
    def status(self) -> Obj:
        return dict(self.api.workloads[KEY].get("status") or {})

    def nodes(self) -> list[str]:
        return [n["nodeName"] for a in self.status["allocations"] for n in a["nodes"]]

    def recorded(self) -> set[str]:
        return {
            name
            for name, node in self.api.nodes.items()
            if node_allocation(name, node["metadata"]["annotations"]) is not None
        }

    def restricted_to(self) -> str:
        return repr(self.api.templates["train"])

    def reasons(self) -> list[str]:
        return [e["reason"] for e in self.api.events]
