"""Why a pod waits, on the objects people already look at (the leader only).

A pod that asks for devices and that the scheduler could not place gets a Warning Event
``NeuronUnschedulable`` whose message is explain's one-paragraph answer (``neuron-dra explain
pod/NAME`` tells the rest). The Event is posted once per change of the reasons, not per
scheduling attempt: the last reasons said are kept per pod UID (a bounded memory, seeded from
the Events already there when a replica starts leading, so a new leader does not say it all
again). A NeuronUltraServerWorkload whose pods wait shows it too, as the condition
``PodsSchedulable`` (False with the top reason code; True again once none waits). That
condition is applied with a field manager of its own, as ``EFAReady`` is, so the status the
decider writes never removes it and never has to compare it.

The loop has its own informers: unscheduled pods (``spec.nodeName=``; pods without claims
are kept as bare names), ResourceClaims, ResourceSlices (whole, unlike the operator's node
devices) and DeviceClasses; it reads the operator's Nodes, workloads and NeuronUltraServers.
A pod is explained again when what explain reads of it changes (its spec, labels, claim
statuses, or whether the scheduler has given up on it: not the scheduler's message, which
changes at every attempt while nodes come and go), and every waiting pod at most every
:data:`SWEEP_SECONDS` when devices, claims, classes or nodes change.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final

import msgspec
from neuron_dra_common.explain import Snapshot, explain_pod
from neuron_dra_common.kube import (
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    UNANSWERED,
    ApiException,
    EventType,
    Informer,
    KubeClient,
    WorkQueue,
    apply_status,
    run_workers,
)
from neuron_dra_common.ultraserver import WORKLOAD_LABEL

from neuron_dra_ultraserver_operator.model import FIELD_MANAGER
from neuron_dra_ultraserver_operator.resources import DEVICE_CLASSES, EVENTS, NUSW, PODS
from neuron_dra_ultraserver_operator.statuses import stamp

__all__ = [
    "CONDITION",
    "REASON",
    "PendingPods",
    "SignatureMemory",
    "Verdict",
    "pod_signature",
    "waiting_for_devices",
    "workload_condition",
    "workload_of",
]

log = logging.getLogger(__name__)

#: The Event's reason on a pod that cannot be scheduled, and who reports it.
REASON: Final = "NeuronUnschedulable"
COMPONENT: Final = "neuron-dra-explain"
#: The workload's condition: whether its pods can be placed.
CONDITION: Final = "PodsSchedulable"
ALL_SCHEDULABLE: Final = "NoPodWaiting"
#: Every waiting pod is explained again at most this often when the cluster changes.
SWEEP_SECONDS: Final = 30.0
#: Pods whose last reasons are remembered (the oldest said are forgotten first).
MEMORY_SIZE: Final = 10_000
#: What the API keeps of an Event's or a condition's message.
MESSAGE_LIMIT: Final = 1024
_MANAGER: Final = f"{FIELD_MANAGER}-pending"
#: A queue key for a workload's condition alone (pod UIDs never start so).
_WORKLOAD: Final = "workload:"

Obj = dict[str, Any]


class Verdict(msgspec.Struct, frozen=True):
    """Why one pod of a workload waits: its name, the top reason code, explain's paragraph."""

    pod: str
    code: str
    message: str


class SignatureMemory:
    """The reasons last said per pod UID, bounded: ``changed`` says whether to speak again.

    >>> memory = SignatureMemory(size=2)
    >>> memory.changed("u1", "held"), memory.changed("u1", "held"), memory.changed("u1", "sel")
    (True, False, True)
    """

    def __init__(self, size: int = MEMORY_SIZE) -> None:
        self._size = size
        self._said: OrderedDict[str, str] = OrderedDict()
        #: pod UID -> the message of its newest Event from before this process led
        self._seen: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._said)

    def seed(self, messages: Mapping[str, str]) -> None:
        """The newest message already posted per pod UID (from the API's Events): a pod
        whose first explanation says the same is not told again."""
        self._seen = dict(messages)

    def changed(self, uid: str, signature: str, *, message: str = "") -> bool:
        """Remember ``signature`` for ``uid``; True when it differs from the last one (or
        from the seeded Event's ``message``, for a pod not seen yet)."""
        last = self._said.get(uid)
        if last is None and uid in self._seen:
            last = signature if self._seen.pop(uid) == message[:MESSAGE_LIMIT] else ""
        self._said[uid] = signature
        self._said.move_to_end(uid)
        while len(self._said) > self._size:
            self._said.popitem(last=False)
        return last != signature

    def forget(self, uid: str) -> None:
        self._said.pop(uid, None)
        self._seen.pop(uid, None)


def waiting_for_devices(pod: Obj) -> bool:
    """A pod with claims that the scheduler tried and could not place (``PodScheduled``
    False), not bound, not being deleted."""
    spec = pod.get("spec") or {}
    meta = pod.get("metadata") or {}
    if not spec.get("resourceClaims") or spec.get("nodeName") or meta.get("deletionTimestamp"):
        return False
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )


def _trim_pod(pod: Obj) -> Obj:
    """Pods with claims as they are (without managedFields); others as their names only."""
    meta = dict(pod.get("metadata") or {})
    meta.pop("managedFields", None)
    if not (pod.get("spec") or {}).get("resourceClaims"):
        keep = ("name", "namespace", "uid", "resourceVersion")
        return {"metadata": {k: meta[k] for k in keep if k in meta}}
    return {**pod, "metadata": meta}


def pod_signature(pod: Obj) -> bytes:
    """What explain reads of the pod itself: a pod update that keeps it is the scheduler
    saying again what it said (its message counts nodes, and changes as they change).

    >>> waiting = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    >>> a = {"spec": {}, "status": {"conditions": [{**waiting, "message": "0/9 nodes"}]}}
    >>> b = {"spec": {}, "status": {"conditions": [{**waiting, "message": "0/8 nodes"}]}}
    >>> pod_signature(a) == pod_signature(b)
    True
    """
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    scheduled = [
        (c.get("status"), c.get("reason"))
        for c in status.get("conditions") or ()
        if c.get("type") == "PodScheduled"
    ]
    return msgspec.json.encode(
        (
            pod.get("spec"),
            meta.get("labels"),
            bool(meta.get("deletionTimestamp")),
            status.get("resourceClaimStatuses"),
            scheduled,
        )
    )


def _trim(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    if "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def _uid(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def workload_of(pod: Obj, claims: Mapping[str, Obj], workloads: Mapping[str, Obj]) -> str:
    """The key (``namespace/name``) of the workload whose devices ``pod`` asks for, or "".

    A claim made from a workload's template carries the workload's name as a label; a pod
    whose claim does not exist yet names the template, which the workload's status names.
    """
    ns = str((pod.get("metadata") or {}).get("namespace") or "")
    spec = pod.get("spec") or {}
    names = [str(s.get("resourceClaimName") or "") for s in spec.get("resourceClaims") or ()]
    names += [
        str(s.get("resourceClaimName") or "")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
    ]
    for name in filter(None, names):
        labels = (claims.get(f"{ns}/{name}", {}).get("metadata") or {}).get("labels") or {}
        owner = labels.get(WORKLOAD_LABEL)
        if owner and f"{ns}/{owner}" in workloads:
            return f"{ns}/{owner}"
    templates = {
        str(s.get("resourceClaimTemplateName"))
        for s in spec.get("resourceClaims") or ()
        if s.get("resourceClaimTemplateName")
    }
    for key, obj in workloads.items():
        shown = (obj.get("status") or {}).get("resourceClaimTemplate")
        if key.startswith(f"{ns}/") and shown in templates:
            return key
    return ""


def workload_condition(workload: Obj, waiting: list[Verdict], *, now: str) -> Obj | None:
    """The ``PodsSchedulable`` condition ``workload`` should show, or None when it shows it
    already. False names the first waiting pod's reason; True is only written over a False
    (a workload none of whose pods ever waited shows no such condition).

    >>> wl = {"metadata": {"generation": 2}, "status": {}}
    >>> workload_condition(wl, [Verdict("p-0", "DevicesHeld", "DevicesHeld: ...")],
    ...                    now="2026-01-01T00:00:00Z")["reason"]
    'DevicesHeld'
    >>> workload_condition(wl, [], now="2026-01-01T00:00:00Z") is None
    True
    """
    shown: Obj = next(
        (
            c
            for c in (workload.get("status") or {}).get("conditions") or ()
            if c.get("type") == CONDITION
        ),
        {},
    )
    if waiting:
        first = min(waiting, key=lambda v: v.pod)
        more = f" (and {len(waiting) - 1} more pods)" if len(waiting) > 1 else ""
        status, reason = "False", first.code
        message = f"pod {first.pod}{more} cannot be scheduled: {first.message}"
    elif shown.get("status") == "False":
        status, reason = "True", ALL_SCHEDULABLE
        message = "no pod of the workload waits for devices"
    else:
        return None
    message = message[:MESSAGE_LIMIT]
    if (shown.get("status"), shown.get("reason"), shown.get("message")) == (
        status,
        reason,
        message,
    ):
        return None
    return {
        "type": CONDITION,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": str(shown.get("lastTransitionTime") or now)
        if shown.get("status") == status
        else now,
        "observedGeneration": (workload.get("metadata") or {}).get("generation", 0),
    }


class PendingPods:
    """Explains waiting pods: their Events and their workloads' ``PodsSchedulable``."""

    def __init__(
        self,
        client: KubeClient,
        *,
        nodes: Mapping[str, Obj],
        workloads: Mapping[str, Obj],
        ultraservers: Mapping[str, Obj],
        memory_size: int = MEMORY_SIZE,
        sweep_seconds: float = SWEEP_SECONDS,
    ) -> None:
        self._client = client
        self._nodes, self._workloads, self._ultraservers = nodes, workloads, ultraservers
        self.pods = Informer(client, PODS, field_selector="spec.nodeName=", transform=_trim_pod)
        self.claims = Informer(client, RESOURCE_CLAIMS, transform=_trim)
        self.slices = Informer(client, RESOURCE_SLICES, transform=_trim)
        self.classes = Informer(client, DEVICE_CLASSES, transform=_trim)
        self.pods.add_listener(self._on_pod)
        for informer in (self.claims, self.slices, self.classes):
            informer.add_listener(self.on_change)
        self._memory = SignatureMemory(memory_size)
        self._sweep_seconds = sweep_seconds
        #: pod UID -> its informer key (a deleted pod's key is still known)
        self._keys: dict[str, str] = {}
        #: pod UID -> :func:`pod_signature` when it was last queued
        self._signatures: dict[str, bytes] = {}
        #: pod UID -> (its workload's key, why it waits)
        self._waiting: dict[str, tuple[str, Verdict]] = {}
        self._queue: WorkQueue[str] | None = None
        self._sweep: asyncio.TimerHandle | None = None
        self._last_sweep = 0.0
        self._changes = 0
        self._snapshot: tuple[int, Snapshot] | None = None

    @property
    def informers(self) -> dict[str, Informer]:
        return {
            "pending-pods-informer": self.pods,
            "pending-claims-informer": self.claims,
            "pending-slices-informer": self.slices,
            "pending-classes-informer": self.classes,
        }

    # --- what starts work ------------------------------------------------------------------

    def _on_pod(self, kind: EventType, pod: Obj) -> None:
        uid = _uid(pod)
        if not uid:
            return
        if kind != "DELETED" and not (pod.get("spec") or {}).get("resourceClaims"):
            return
        if self._queue is None:
            # A standby only follows: the leader to come reads the cache when it starts.
            if kind == "DELETED":
                self._keys.pop(uid, None)
                self._signatures.pop(uid, None)
                self._memory.forget(uid)
            return
        if kind == "DELETED":
            self._signatures.pop(uid, None)
        else:
            signature = pod_signature(pod)
            if self._signatures.get(uid) == signature:
                # The scheduler's next attempt, same pod: the sweep follows the cluster.
                return
            self._signatures[uid] = signature
        # Kept until the pod is looked at: a deleted pod's workload may need telling.
        self._keys[uid] = _key(pod)
        self._queue.add(uid)

    def invalidate(self, kind: EventType, obj: Obj) -> None:
        """Workloads or NeuronUltraServers changed: the next explanation reads them anew
        (their pods are explained again when the scheduler updates them)."""
        self._changes += 1

    def on_change(self, kind: EventType, obj: Obj) -> None:
        """Devices, claims, classes or nodes changed: every waiting pod again, soon but at
        most once per ``sweep_seconds``."""
        self._changes += 1
        if self._queue is None or self._sweep is not None:
            return
        now = time.monotonic()
        delay = max(1.0, self._last_sweep + self._sweep_seconds - now)
        self._sweep = asyncio.get_running_loop().call_later(delay, self._sweep_all)

    def _sweep_all(self) -> None:
        self._sweep = None
        self._last_sweep = time.monotonic()
        if self._queue is None:
            return
        for pod in list(self.pods.cache.values()):
            if waiting_for_devices(pod):
                self._queue.add(_uid(pod))

    # --- leading ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Explain waiting pods until :meth:`shutdown` (the informers are synced)."""
        queue: WorkQueue[str] = WorkQueue(name="pending-pods", qps=20.0, burst=100)
        self._queue = queue
        await self._seed()
        for pod in list(self.pods.cache.values()):
            self._keys[_uid(pod)] = _key(pod)
            if waiting_for_devices(pod):
                queue.add(_uid(pod))
        # After those pods (one worker, in order): a workload that shows pods waiting
        # which were placed meanwhile (while no replica led) is told so.
        for key, obj in list(self._workloads.items()):
            if workload_condition(obj, [], now="") is not None:
                queue.add(_WORKLOAD + key)
        try:
            # One at a time: the work is computing, and a workload's condition is written
            # from one place.
            await run_workers(queue, self.explain, workers=1)
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        if self._queue is not None:
            self._queue.shutdown()
            self._queue = None

    async def _seed(self) -> None:
        """The newest ``NeuronUnschedulable`` message per pod, from the Events there."""
        try:
            events, _ = await self._client.list(EVENTS, field_selector=f"reason={REASON}")
        except (ApiException, *UNANSWERED) as exc:
            log.warning("earlier pod events not read", extra={"error": str(exc)})
            return
        newest: dict[str, tuple[str, str]] = {}
        for event in events:
            uid = str((event.get("involvedObject") or {}).get("uid") or "")
            when = str(event.get("lastTimestamp") or event.get("eventTime") or "")
            if uid and when >= newest.get(uid, ("", ""))[0]:
                newest[uid] = (when, str(event.get("message") or ""))
        self._memory.seed({uid: message for uid, (_, message) in newest.items()})

    # --- one pod ---------------------------------------------------------------------------

    def _snap(self, pod: Obj) -> Snapshot:
        if self._snapshot is None or self._snapshot[0] != self._changes:
            base = Snapshot.build(
                nodes=list(self._nodes.values()),
                slices=list(self.slices.cache.values()),
                claims=list(self.claims.cache.values()),
                classes=list(self.classes.cache.values()),
                workloads=list(self._workloads.values()),
                ultraservers=list(self._ultraservers.values()),
            )
            self._snapshot = (self._changes, base)
        return msgspec.structs.replace(self._snapshot[1], pods=[pod])

    async def explain(self, uid: str) -> None:
        """Post the pod's Event when its reasons changed; update its workload's condition."""
        if uid.startswith(_WORKLOAD):
            await self._write_condition(uid.removeprefix(_WORKLOAD))
            return
        key = self._keys.get(uid, "")
        pod = self.pods.cache.get(key)
        if pod is None or _uid(pod) != uid or not waiting_for_devices(pod):
            self._memory.forget(uid)
            if pod is None or _uid(pod) != uid:
                self._keys.pop(uid, None)
            await self._settle(uid, None)
            return
        meta = pod["metadata"]
        try:
            exp = explain_pod(self._snap(pod), namespace=meta["namespace"], name=meta["name"])
        except Exception as exc:
            # Advice only: a pod explain cannot read is left to the scheduler's own Event.
            log.error("pod not explained", extra={"pod": key, "error": repr(exc)})
            return
        if exp.summary.schedulable:
            # Placed at the scheduler's next attempt (or what it saw is older than this).
            await self._settle(uid, None)
            return
        message = exp.event_message()[:MESSAGE_LIMIT]
        if self._memory.changed(uid, exp.signature(), message=message):
            await self._post(pod, message)
        workload = workload_of(pod, self.claims.cache, self._workloads)
        verdict = Verdict(pod=meta["name"], code=exp.top_code(), message=message)
        await self._settle(uid, (workload, verdict) if workload else None)

    async def _post(self, pod: Obj, message: str) -> None:
        meta = pod["metadata"]
        involved = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        }
        try:
            await self._client.post_event(
                involved, reason=REASON, message=message, component=COMPONENT, warning=True
            )
        except (ApiException, ValueError, *UNANSWERED) as exc:
            # An Event is for people: not worth a retry now; the pod's next look says it.
            self._memory.forget(meta["uid"])
            log.warning("event not recorded", extra={"pod": _key(pod), "error": str(exc)})

    async def _settle(self, uid: str, now_waiting: tuple[str, Verdict] | None) -> None:
        """Record why pod ``uid`` waits (None: it does not); write the conditions of the
        workloads this changes."""
        before = self._waiting.pop(uid, None)
        if now_waiting is not None:
            self._waiting[uid] = now_waiting
        if before == now_waiting:
            return
        for key in {pair[0] for pair in (before, now_waiting) if pair is not None}:
            await self._write_condition(key)

    async def _write_condition(self, key: str) -> None:
        workload = self._workloads.get(key)
        if workload is None:
            return
        waiting = [v for w, v in self._waiting.values() if w == key]
        cond = workload_condition(workload, waiting, now=stamp())
        if cond is None:
            return
        meta = workload.get("metadata") or {}
        body = {
            "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
            "status": {"conditions": [cond]},
        }
        try:
            await apply_status(self._client, NUSW, body, field_manager=_MANAGER)
        except ApiException as exc:
            if exc.status != 404:
                raise
