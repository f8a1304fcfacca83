"""Performs what the decider decided: API writes, allocator requests, queue hooks.

Every write is a server-side apply as one field manager, a merge patch, or a create that
tolerates "already exists", so repeating it after a restart changes nothing. A query's answer
comes back as a new :class:`~neuron_dra_ultraserver_operator.decide.Facts`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import msgspec
from neuron_dra_common.events import (
    AllocationDecided,
    AllocationReleased,
    AllocationRequested,
    AnyEvent,
    Event,
    ObjectRef,
    WorkloadStateChanged,
)
from neuron_dra_common.kube import (
    NODES,
    RESOURCE_CLAIMS,
    ApiException,
    KubeClient,
    Resource,
    apply,
    apply_status,
)
from neuron_dra_common.ultraserver import (
    NODE_ALLOCATION,
    WORKLOAD_UID_LABEL,
    NodeAllocationError,
    encode_node_allocation,
    node_allocation,
)

from neuron_dra_ultraserver_operator import metrics
from neuron_dra_ultraserver_operator.actions import (
    Action,
    ApplyTemplate,
    DeletePods,
    DeleteTemplate,
    Emit,
    ForgetEvents,
    ListClaims,
    NodeWrite,
    Recheck,
    Release,
    RequestAllocation,
    Requeue,
    RetireTemplate,
    SetFinalizer,
    Together,
    TouchUltraServers,
    WakeWaiting,
    WriteNodeRecords,
    WriteStatus,
)
from neuron_dra_ultraserver_operator.faults import CrashPoint, no_crash
from neuron_dra_ultraserver_operator.inputs import Facts, Refusal
from neuron_dra_ultraserver_operator.manifests import device_selectors, selectors
from neuron_dra_ultraserver_operator.model import (
    FIELD_MANAGER,
    FINALIZER,
    TRACEPARENT,
    Workload,
)
from neuron_dra_ultraserver_operator.resources import (
    NUSW,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
)
from neuron_dra_ultraserver_operator.statuses import age_seconds

__all__ = ["Allocate", "Executor", "owned"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
#: Reads and compare-and-set writes of one node record before the pass gives up (a Node's
#: status changes under the write now and then; each try reads it again).
_NODE_ATTEMPTS = 5


class _Stale(Exception):
    """A decision made on a copy of a Node that may be old: made again on a fresh read."""


class _Refused(Exception):
    """An object to write belongs to someone else: the write is not made."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal)
        self.refusal = refusal


class Allocate(Protocol):
    """Send an allocator request and wait for its answer (over the bus)."""

    async def __call__(self, event: Event) -> AnyEvent: ...


#: Publishes an event with its de-duplication id (the bus publisher's ``publish``).
Publish = Callable[[Event, str], Awaitable[object]]


class Executor:
    """Performs actions for one workload at a time, in the order given."""

    def __init__(
        self,
        *,
        client: KubeClient,
        allocate: Allocate,
        requeue: Callable[[str, float], None],
        wake: Callable[[], None],
        touch: Callable[[Iterable[str]], None],
        crash: CrashPoint = no_crash,
        publish: Publish | None = None,
        nodes: Mapping[str, Obj] | None = None,
    ) -> None:
        self.client = client
        self._publish = publish
        #: The Node informer's cache: the version a node record write starts from.
        self._nodes: Mapping[str, Obj] = nodes if nodes is not None else {}
        #: node -> (the Node the last record write of this operator returned, the versions
        #: known to be older: what the cache showed and the write started from, and those of
        #: the operator's writes before it). While the cache shows one of those, it is behind
        #: the operator's own writes (an echo of an earlier one, or not even that), and the
        #: copy the last write returned is the newest.
        self._written: dict[str, tuple[Obj, frozenset[str]]] = {}
        #: workload key -> what this operator's last write of it (the status, the finalizer)
        #: returned, until the informer shows that version or another writer's.
        self._wrote: dict[str, Obj] = {}
        #: workload key -> its versions known to be older than the operator's last write of
        #: it: those its writes started from and made (an informer showing one is behind).
        self._older: dict[str, set[str]] = {}
        #: The Node cache as this operator knows it: its own writes over the informer's.
        self.newest_nodes: Mapping[str, Obj] = _Newest(self)
        self._states: dict[str, str] = {}
        self._allocate = allocate
        self._requeue = requeue
        self._wake = wake
        self._touch = touch
        self._crash = crash
        self._last_event: dict[str, tuple[str, str]] = {}
        #: workload UID -> its Events being sent
        self._sending: dict[str, list[asyncio.Task[None]]] = {}

    async def perform(self, workload: Workload, actions: Sequence[Action], facts: Facts) -> Facts:
        """Perform ``actions`` for ``workload``; ``facts`` with what the queries learned.

        A write that would change another's object (a Node another workload holds, a
        template this workload does not own) is not made: the actions stop there and
        ``facts.refused`` says why, for the decider.
        """
        # The state as the API showed it, then as this call wrote it (several writes a call).
        self._states[workload.metadata.uid] = str(workload.reported.get("state") or "")
        loop = asyncio.get_running_loop()
        began = loop.time()
        took: list[tuple[float, str]] = []
        # Events are for people, not a step of the allocation: each is sent beside the
        # writes and queries that follow it instead of holding them up (see ``sent``).
        events = self._sending.setdefault(workload.metadata.uid, [])
        try:
            for action in actions:
                if isinstance(action, Emit):
                    events += self._emit(workload, action)
                    continue
                started = loop.time()
                try:
                    facts = await self._perform(workload, action, facts)
                finally:
                    took.append((loop.time() - started, _named(action)))
        except _Refused as exc:
            log.warning(
                "write refused",
                extra={
                    "workload": workload.key,
                    "kind": exc.refusal.kind,
                    "object": exc.refusal.name,
                    "holder": exc.refusal.holder,
                },
            )
            return msgspec.structs.replace(facts, refused=exc.refusal)
        finally:
            _report_slow(workload, took, total=loop.time() - began)
        return facts

    def newest(self, key: str, cached: Obj) -> Obj:
        """The newest copy of workload ``key`` this operator has without asking: what its
        own last write returned while the informer still shows an older version (its own
        write not echoed yet), else the informer's ``cached`` copy. A pass thus never
        decides again on what it already wrote, nor writes it twice."""
        wrote = self._wrote.get(key)
        if wrote is None:
            return cached
        if _version(cached) in self._older.get(key, ()):
            return wrote
        # The informer shows this write, or another writer's after it: the copy goes, and
        # its version, from now on older, is remembered (another write may follow before
        # the informer shows this one).
        del self._wrote[key]
        self._older.setdefault(key, set()).add(_version(wrote))
        return cached

    def forget(self, key: str) -> None:
        """The workload ``key`` is gone: its copy goes too."""
        self._wrote.pop(key, None)
        self._older.pop(key, None)

    def _wrote_workload(self, wl: Workload, written: Obj) -> None:
        """Keep ``written``, what a write of ``wl`` returned, as its newest copy."""
        older = self._older.setdefault(wl.key, set())
        older.add(wl.metadata.resource_version)
        before = self._wrote.get(wl.key)
        if before is not None:
            older.add(_version(before))
        older.discard(_version(written))
        self._wrote[wl.key] = written

    async def sent(self, workload: Workload) -> None:
        """Wait until the Events of ``workload`` are sent (the end of a pass)."""
        await _together(self._sending.pop(workload.metadata.uid, ()))

    async def _perform(self, wl: Workload, action: Action, facts: Facts) -> Facts:
        match action:
            case RequestAllocation():
                answer = await self._request(wl, action)
                if answer.granted and action.step:
                    self._crash(action.step)
                if action.purpose == "hold":
                    return facts
                if action.purpose == "replace":
                    return msgspec.structs.replace(facts, replacement=answer)
                return msgspec.structs.replace(facts, answer=answer)
            case ListClaims():
                return msgspec.structs.replace(facts, claims=await self._claims(wl))
            case WriteStatus():
                await self._status(wl, action.status)
                await self._state_changed(wl, action.status)
                self._touch(action.touch)
                _observe_allocation(wl, action.status, now=facts.now)
            case WriteNodeRecords():
                await _together(self._node(wl, w, step=action.step) for w in action.writes)
                return facts
            case Together():
                await _together(self._perform(wl, a, facts) for a in action.actions)
            case ApplyTemplate():
                await self._apply_template(wl, action.template)
            case RetireTemplate():
                await self._retire_template(wl, action.template)
            case DeleteTemplate():
                if not await self._delete_template(wl, action.name, force=action.force):
                    return facts
            case DeletePods():
                await self._delete_pods(
                    wl, keep=set(action.keep), force=set(action.force), wanted=action.selectors
                )
            case Release():
                await self._release(wl)
            case SetFinalizer():
                await self._finalizer(wl, present=action.present)
            case ForgetEvents():
                self._last_event.pop(wl.metadata.uid, None)
                self._states.pop(wl.metadata.uid, None)
                self.forget(wl.key)
            case Requeue():
                self._requeue(wl.key, action.after)
            case WakeWaiting():
                self._wake()
            case Recheck():
                for key in action.keys:
                    self._requeue(key, 0.0)
            case TouchUltraServers():
                self._touch(action.names)
        if action.step:
            self._crash(action.step)
        return facts

    # --- the allocator -----------------------------------------------------------------------

    async def _request(self, wl: Workload, action: RequestAllocation) -> AllocationDecided:
        answer = await self._allocate(
            AllocationRequested(
                request_id=f"{wl.metadata.uid}-{wl.metadata.generation}",
                workload=_ref(wl),
                topology_size=wl.spec.topology_size,
                server_count=wl.spec.server_count,
                instance_type=wl.spec.instance_type,
                generation=wl.metadata.generation,
                nodes=action.nodes,
                exclude_ultraservers=action.exclude,
            )
        )
        if not isinstance(answer, AllocationDecided):
            raise TypeError(f"{wl}: the allocator answered {answer.event_type()}")
        return answer

    async def _release(self, wl: Workload) -> None:
        await self._allocate(
            AllocationReleased(request_id=f"release-{wl.metadata.uid}", workload=_ref(wl))
        )

    # --- the API -----------------------------------------------------------------------------

    async def _finalizer(self, wl: Workload, *, present: bool) -> None:
        meta: Obj = {"name": wl.metadata.name, "namespace": wl.metadata.namespace}
        if present:
            meta["finalizers"] = [FINALIZER]
        try:
            written = await apply(
                self.client, NUSW, {"metadata": meta}, field_manager=FIELD_MANAGER
            )
        except ApiException as exc:
            if exc.status == 404 and not present:
                return  # already gone
            raise
        self._wrote_workload(wl, written)

    async def _status(self, wl: Workload, status: Obj) -> None:
        body = {
            "metadata": {"name": wl.metadata.name, "namespace": wl.metadata.namespace},
            "status": status,
        }
        try:
            written = await apply_status(self.client, NUSW, body, field_manager=FIELD_MANAGER)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return
        self._wrote_workload(wl, written)

    async def _state_changed(self, wl: Workload, status: Obj) -> None:
        """Put a state change on the bus for audit and alerts (never holds the reconcile up)."""
        state = str(status.get("state") or "")
        previous = self._states.get(wl.metadata.uid, "")
        if self._publish is None or not state or state == previous:
            return
        self._states[wl.metadata.uid] = state
        servers = tuple(status.get("allocatedUltraServers") or ())
        event = WorkloadStateChanged(
            workload=_ref(wl),
            state=state,
            previous=previous,
            reason=str(status.get("reason") or ""),
            ultraservers=servers,
        )
        # The same transition written again (a retry, a restart) is stored once.
        msg_id = f"wl:{wl.metadata.uid}:{wl.metadata.generation}:{previous}:{state}:" + ",".join(
            servers
        )
        try:
            await self._publish(event, msg_id)
        except Exception as exc:  # an audit event must not fail the reconcile
            log.warning(
                "workload state not published", extra={"workload": wl.key, "error": repr(exc)}
            )

    async def _node(self, wl: Workload, write: NodeWrite, *, step: str) -> None:
        """Write (or remove) the allocation record on a node, with its trace context.

        Compare-and-set: a record of another workload is never overwritten (refused) nor
        removed (left), and the patch carries the resourceVersion of the copy of the Node it
        was decided on (the operator's own last write of it, or the informer's copy), so a
        node changed since (another writer, or just its status) fails it (409) and is read
        again, instead of being overwritten. A merge patch, not an apply:
        an apply to a Node that is gone would create an empty Node object, while a patch
        answers 404, and a node that is gone holds nothing.
        """
        fresh = False
        for attempt in range(_NODE_ATTEMPTS):
            try:
                await self._node_once(wl, write, fresh=fresh)
                break
            except _Stale:
                fresh = True  # decided again on what the apiserver holds (one read more)
            except ApiException as exc:
                fresh = True
                if exc.status != 409 or attempt == _NODE_ATTEMPTS - 1:
                    raise
        if step:
            self._crash(step)

    def _known(self, name: str) -> Obj | None:
        """The newest copy of Node ``name`` this operator has without asking: its own last
        write while the informer shows that or an earlier version of the operator's own
        writes, else the informer's (someone else wrote the Node since)."""
        cached = self._nodes.get(name)
        written = self._written.get(name)
        if written is not None:
            node, ours = written
            if cached is None or _version(cached) in ours:
                return node
            del self._written[name]
        return cached

    async def _node_once(self, wl: Workload, write: NodeWrite, *, fresh: bool) -> None:
        """One compare-and-set. It starts from the copy of the Node the operator has (the
        write then costs one request, not a read and a write); the version it carries makes
        the write fail if the Node changed since, and the next try reads it. A decision to
        write nothing, or to refuse, is only ever taken on a fresh read."""
        node = None if fresh else self._known(write.node)
        if node is None:
            fresh = True
            try:
                node = await self.client.get(NODES, write.node)
            except ApiException as exc:
                if exc.status == 404:
                    return
                raise
        meta = node.get("metadata") or {}
        try:
            current = node_allocation(write.node, meta.get("annotations") or {})
        except NodeAllocationError:
            current = None  # unreadable: holds nothing, and is written over
        mine = current is None or current.workload_uid == wl.metadata.uid
        if current is not None and not mine:
            if not fresh:
                raise _Stale(write.node)
            if write.record is None:
                return  # another workload's record: not this one's to remove
            if not write.over or current.workload_uid != write.over:
                raise _Refused(Refusal(kind="Node", name=write.node, holder=current.workload))
        annotations: dict[str, str | None] = {}
        if write.record is None:
            if current is None:
                if not fresh:
                    raise _Stale(write.node)
                return
            annotations = {NODE_ALLOCATION: None, TRACEPARENT: None}
        else:
            annotations[NODE_ALLOCATION] = encode_node_allocation(write.record)
            if write.traceparent:
                annotations[TRACEPARENT] = write.traceparent
        body: Obj = {"metadata": {"annotations": annotations}}
        if meta.get("resourceVersion"):
            body["metadata"]["resourceVersion"] = meta["resourceVersion"]
        # What the informer shows now is older than what this write makes; read after the
        # write, it could be another writer's newer version.
        base, cached = _version(node), _version(self._nodes.get(write.node) or {})
        try:
            written = await self.client.patch(NODES, write.node, body)
        except ApiException as exc:
            self._written.pop(write.node, None)
            if exc.status != 404:
                raise
            return
        # The next write of this node (Pending, then Bound) starts from this version.
        made = _version(written)
        self._written[write.node] = (written, self._chain(write.node, base, made, cached=cached))

    def _chain(self, name: str, base: str, made: str, *, cached: str) -> frozenset[str]:
        """The versions of Node ``name`` older than ``made``, the one a write from ``base``
        just made: ``cached`` (the informer's before the write), ``base``, and those of the
        operator's writes before when this one started from the last of them (until the
        informer shows ``base``)."""
        before = self._written.get(name)
        ours = {cached, base, made}
        if before is not None and _version(before[0]) == base and cached != base:
            ours |= before[1]
        return frozenset(ours)

    async def _template(self, name: str, namespace: str) -> Obj | None:
        """The ResourceClaimTemplate ``namespace/name`` as the API has it now, or None."""
        try:
            found: Obj = await self.client.get(RESOURCE_CLAIM_TEMPLATES, name, namespace=namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return None
        return found

    async def _apply_template(self, wl: Workload, template: Obj) -> None:
        """Create the workload's template, or apply it over the one the workload owns (its
        ownerReference names the workload's UID); one that exists and is not the workload's
        is never written (refused). Its spec is immutable, so one whose nodes changed (a
        replacement) is deleted (only that very object: a UID precondition) and created
        again. Pods created in between wait for it."""
        meta = template["metadata"]
        name, ns = meta["name"], meta["namespace"]
        existing = await self._template(name, ns)
        if existing is None:
            await self._create_template(wl, template)
            return
        if not owned(existing, wl):
            raise _Refused(
                Refusal(kind="ResourceClaimTemplate", name=name, holder=_owner_of(existing))
            )
        uid = str((existing.get("metadata") or {}).get("uid") or "")
        if selectors(existing) != selectors(template):
            # Other nodes (a replacement): its spec is immutable, so an apply could only be
            # refused; that very object is replaced at once.
            log.info("template replaced", extra={"template": name})
            await self._delete(RESOURCE_CLAIM_TEMPLATES, name, ns, uid=uid)
            await self._create_template(wl, template)
            return
        if _covers(existing, template):
            return  # every field this operator sets holds its value already: nothing to write
        # The version read: one replaced in between (by anyone) fails the apply (409).
        versioned = {**template, "metadata": {**meta, "resourceVersion": _version(existing)}}
        try:
            await apply(
                self.client, RESOURCE_CLAIM_TEMPLATES, versioned, field_manager=FIELD_MANAGER
            )
        except ApiException as exc:
            said = exc.reason + exc.body.decode(errors="replace")
            if exc.status != 422 or "immutable" not in said:
                raise
            log.info("template replaced", extra={"template": name})
            await self._delete(RESOURCE_CLAIM_TEMPLATES, name, ns, uid=uid)
            await self._create_template(wl, template)

    async def _create_template(self, wl: Workload, template: Obj) -> None:
        """Create (never apply: an apply would merge into a template someone else created
        in between); one that appeared meanwhile is checked like any other."""
        meta = template["metadata"]
        try:
            await self.client.create(
                RESOURCE_CLAIM_TEMPLATES,
                {
                    "apiVersion": RESOURCE_CLAIM_TEMPLATES.api_version,
                    "kind": RESOURCE_CLAIM_TEMPLATES.kind,
                    **template,
                },
                namespace=meta["namespace"],
                field_manager=FIELD_MANAGER,
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
            existing = await self.client.get(
                RESOURCE_CLAIM_TEMPLATES, meta["name"], namespace=meta["namespace"]
            )
            if not owned(existing, wl):
                raise _Refused(
                    Refusal(
                        kind="ResourceClaimTemplate",
                        name=meta["name"],
                        holder=_owner_of(existing),
                    )
                ) from exc

    async def _delete_template(self, wl: Workload, name: str, *, force: Sequence[str] = ()) -> bool:
        """Delete the workload's template and the pods using it; True if it deleted the
        template."""
        ns = wl.metadata.namespace
        deleted = False
        rct = await self._template(name, ns)
        if rct is not None and owned(rct, wl):
            uid = str((rct.get("metadata") or {}).get("uid") or "")
            await self._delete(RESOURCE_CLAIM_TEMPLATES, name, ns, uid=uid)
            deleted = True
        await self._delete_pods(wl, keep=set(), force=set(force))
        return deleted

    async def _retire_template(self, wl: Workload, template: Obj) -> None:
        """Delete the workload's template (only that very object: a UID precondition) when
        its claims would take other nodes than ``template``'s; leave any other alone."""
        meta = template["metadata"]
        name, ns = meta["name"], meta["namespace"]
        existing = await self._template(name, ns)
        if existing is None:
            return
        if not owned(existing, wl) or selectors(existing) == selectors(template):
            return  # another's is refused when the template is written; this one stays
        log.info("template retired", extra={"template": name})
        uid = str((existing.get("metadata") or {}).get("uid") or "")
        await self._delete(RESOURCE_CLAIM_TEMPLATES, name, ns, uid=uid)

    async def _delete_pods(
        self, wl: Workload, *, keep: set[str], force: set[str], wanted: Sequence[str] = ()
    ) -> None:
        """Delete the workload's pods that run on a node outside ``keep``. A pod is the
        workload's when one of its claims carries the workload's UID label (claims copy it
        from the template): a pod of another workload that uses a template of the same
        name is never touched. Pods not scheduled yet stay, unless their claims take other
        nodes than the ``wanted`` selectors (made from an earlier version of the template,
        e.g. for a pod Kubernetes recreated after evicting one from a lost node's tainted
        devices): those would wait for the old nodes for ever. A pod on a ``force`` node
        goes at once: its kubelet is gone and would never confirm, so a graceful delete
        would leave it Terminating and its controller waiting."""
        ns = wl.metadata.namespace
        (pods, _), claims = await asyncio.gather(
            self.client.list(PODS, namespace=ns), self._workload_claims(wl)
        )
        using = [pod for pod in pods if _claims_of(pod) & claims.keys()]
        stale = _stale_pending(using, claims, wanted=tuple(wanted)) if keep else set()
        deletes = []
        for pod in using:
            spec = pod.get("spec") or {}
            node = str(spec.get("nodeName") or "")
            name = str((pod.get("metadata") or {}).get("name", ""))
            if node in keep or (keep and not node and name not in stale):
                continue
            meta = pod.get("metadata") or {}
            now = node in force
            if meta.get("deletionTimestamp") and not now:
                continue
            deletes.append(self._delete(PODS, meta.get("name", ""), ns, grace=0 if now else None))
        # Independent deletes: sent together, not one after another.
        await _together(deletes)

    async def _workload_claims(self, wl: Workload) -> dict[str, Obj]:
        """The workload's claims (those carrying its UID label), by name."""
        claims, _ = await self.client.list(
            RESOURCE_CLAIMS,
            namespace=wl.metadata.namespace,
            label_selector=f"{WORKLOAD_UID_LABEL}={wl.metadata.uid}",
        )
        return {str((c.get("metadata") or {}).get("name", "")): c for c in claims}

    async def _delete(
        self,
        resource: Resource,
        name: str,
        namespace: str,
        *,
        grace: int | None = None,
        uid: str = "",
    ) -> None:
        """Delete ``name``; with ``uid``, only that very object (a precondition: one made
        again under the same name in between stays)."""
        try:
            await self.client.delete(
                resource, name, namespace=namespace, uid=uid, grace_period=grace
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def _claims(self, wl: Workload) -> tuple[str, ...]:
        return tuple(sorted(await self._workload_claims(wl)))

    def _emit(self, wl: Workload, action: Emit) -> list[asyncio.Task[None]]:
        """Start recording ``action``'s Event on the workload, once per distinct reason and
        message in a row (decided here, in the order of the actions, not when it is sent)."""
        key = wl.metadata.uid
        said = (action.reason, action.message)
        if self._last_event.get(key) == said:
            return []
        self._last_event[key] = said
        sending = self._event(wl, reason=action.reason, message=action.message, warn=action.warning)
        return [asyncio.create_task(sending, name=f"event {wl.key} {action.reason}")]

    async def _event(self, wl: Workload, *, reason: str, message: str, warn: bool) -> None:
        """Record an Event on the workload."""
        try:
            await self.client.post_event(
                {
                    "apiVersion": NUSW.api_version,
                    "kind": NUSW.kind,
                    "name": wl.metadata.name,
                    "namespace": wl.metadata.namespace,
                    "uid": wl.metadata.uid,
                },
                reason=reason,
                message=message,
                component=FIELD_MANAGER,
                warning=warn,
            )
        except (ApiException, ValueError) as exc:
            # An Event is for people; losing one must not stall the reconcile.
            log.warning("event not recorded", extra={"workload": wl.key, "error": str(exc)})


class _Newest(Mapping[str, Obj]):
    """The Node informer's cache, with the executor's own newer copies over it (see
    ``Executor._known``): the records a pass decides on include its own last writes."""

    def __init__(self, executor: Executor) -> None:
        self._executor = executor

    def __getitem__(self, name: str) -> Obj:
        if name not in self._executor._nodes:
            raise KeyError(name)
        node = self._executor._known(name)
        if node is None:
            raise KeyError(name)
        return node

    def __iter__(self) -> Iterator[str]:
        return iter(self._executor._nodes)

    def __len__(self) -> int:
        return len(self._executor._nodes)


def _named(action: Action) -> str:
    """How the slow-reconcile log names an action (the ones performed together, with +)."""
    if isinstance(action, Together):
        return "+".join(_named(a) for a in action.actions)
    return type(action).__name__


async def _together(calls: Iterable[Awaitable[object]]) -> None:
    """Await ``calls`` at once; the first failure is raised once all of them ended (none is
    left running behind the caller)."""
    for outcome in await asyncio.gather(*calls, return_exceptions=True):
        if isinstance(outcome, BaseException):
            raise outcome


#: A reconcile slower than this is logged with what its actions took.
SLOW_RECONCILE_SECONDS = 1.0


def _report_slow(wl: Workload, took: Sequence[tuple[float, str]], *, total: float) -> None:
    """Log a slow reconcile with its slowest actions, so that a slow recovery can be read off
    the operator's log."""
    if total < SLOW_RECONCILE_SECONDS:
        return
    slowest = sorted(took, reverse=True)[:5]
    log.info(
        "slow reconcile",
        extra={
            "workload": wl.key,
            "seconds": round(total, 3),
            "actions": len(took),
            "slowest": ", ".join(f"{name} {seconds:.3f} s" for seconds, name in slowest),
        },
    )


def owned(obj: Obj, wl: Workload) -> bool:
    """Whether ``obj`` names ``wl`` (by UID) as its owner."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return any(r.get("uid") == wl.metadata.uid for r in refs)


def _owner_of(obj: Obj) -> str:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    named = [f"{r.get('kind', '?')} {r.get('name', '?')}" for r in refs if r.get("controller")]
    return "owned by " + ", ".join(named) if named else "made by someone else"


def _covers(have: object, want: object) -> bool:
    """Whether ``have`` (an object as the API returns it) holds every field of ``want`` with
    the same value; fields the API added (defaults, metadata it keeps) do not matter.

    >>> _covers({"a": 1, "b": [{"c": 2, "d": 3}]}, {"b": [{"c": 2}]})
    True
    """
    if isinstance(want, dict):
        return isinstance(have, dict) and all(
            k in have and _covers(have[k], v) for k, v in want.items()
        )
    if isinstance(want, list):
        return (
            isinstance(have, list)
            and len(have) == len(want)
            and all(_covers(h, w) for h, w in zip(have, want, strict=True))
        )
    return have == want


def _version(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _stale_pending(
    pods: Sequence[Obj], made: Mapping[str, Obj], *, wanted: tuple[str, ...]
) -> set[str]:
    """Names of the pods not scheduled yet with a claim that takes other nodes than the
    ``wanted`` selectors (claims copy their template's requests when they are made)."""
    if not wanted:
        return set()
    stale: set[str] = set()
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName"):
            continue
        for name in _claims_of(pod):
            claim = made.get(name)
            if (
                claim is not None
                and device_selectors((claim.get("spec") or {}).get("devices") or {}) != wanted
            ):
                stale.add(str((pod.get("metadata") or {}).get("name", "")))
    return stale


def _claims_of(pod: Obj) -> set[str]:
    """The names of the claims the pod uses (made from its templates, or named)."""
    out = {
        str(s.get("resourceClaimName"))
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
        if s.get("resourceClaimName")
    }
    out |= {
        str(c.get("resourceClaimName"))
        for c in (pod.get("spec") or {}).get("resourceClaims") or ()
        if c.get("resourceClaimName")
    }
    return out


def _ref(wl: Workload) -> ObjectRef:
    return ObjectRef(namespace=wl.metadata.namespace, name=wl.metadata.name, uid=wl.metadata.uid)


def _observe_allocation(wl: Workload, status: Obj, *, now: str) -> None:
    """The first Allocated of a workload: how long it took from its creation."""
    if status.get("state") != "Allocated" or wl.reported.get("allocationTime"):
        return
    if wl.metadata.creation_timestamp:
        seconds = age_seconds(wl.metadata.creation_timestamp, now=now)
        metrics.ALLOCATION_SECONDS.observe(max(seconds, 0.0))
