"""One writer among replicas: leader election over a ``coordination.k8s.io/v1`` Lease.

Any number of replicas run; the one holding the Lease does the work, the others wait. The
holder renews every third of the lease; a replica takes the Lease over only when it went
unrenewed for ``lease_seconds``, with an optimistic (resourceVersion) update so two
candidates can never both win. A leader that cannot renew before its lease ends stops
working at once, so two writers never overlap by more than the time a write already in flight
takes; with :meth:`Elector.serve` it then campaigns again in the same process, and leads again
(its work starting over from fresh lists) the moment it holds the Lease again: after an
apiserver outage that is at the first renewal the apiserver answers, since no one else could
write the Lease meanwhile. A replica that is asked to stop hands the Lease back, so a standby
takes over at once instead of after the lease.

A process restarted under the same identity (a container restarted in its pod) holds the
Lease again at once: the holder it finds is itself.

>>> elector = Elector(client, namespace="neuron-dra-driver",
...                   name="neuron-dra-ultraserver-operator", identity=pod_name)
>>> await elector.run(lead)          # returns when the Lease is lost or stop() was called
>>> await elector.serve(lead)        # leads again after each loss, until stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import msgspec

from neuron_dra_common.kube.client import UNANSWERED, ApiException, KubeClient, Resource
from neuron_dra_common.kube.metrics import LEADING

__all__ = ["LEASES", "Elector", "LeaseState", "decide", "read_lease"]

log = logging.getLogger(__name__)

LEASES: Final = Resource(
    group="coordination.k8s.io", version="v1", plural="leases", kind="Lease", namespaced=True
)
_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"

Obj = dict[str, Any]
Lead = Callable[[], Coroutine[object, object, None]]
#: What a Lease call may fail with while the apiserver is away; the next round tries again.
_TRANSIENT: Final = (ApiException, *UNANSWERED)


class LeaseState(msgspec.Struct, frozen=True, kw_only=True):
    """What a Lease says: who holds it, when it was renewed, for how long."""

    holder: str
    renewed: datetime | None
    duration: float
    transitions: int = 0


def read_lease(obj: Obj) -> LeaseState:
    spec = obj.get("spec") or {}
    raw = spec.get("renewTime")
    renewed = datetime.strptime(raw, _TIME).replace(tzinfo=UTC) if raw else None
    return LeaseState(
        holder=spec.get("holderIdentity") or "",
        renewed=renewed,
        duration=float(spec.get("leaseDurationSeconds") or 0),
        transitions=int(spec.get("leaseTransitions") or 0),
    )


def decide(state: LeaseState | None, *, me: str, now: datetime) -> bool:
    """May ``me`` write the Lease now (renew it, or take over an expired or released one)?

    >>> decide(None, me="a", now=datetime.now(UTC))
    True
    """
    if state is None or not state.holder or state.holder == me:
        return True
    if state.renewed is None:
        return True
    return now >= state.renewed + timedelta(seconds=state.duration)


class Elector:
    """Campaigns for the Lease, runs ``lead`` while holding it, returns when it is lost."""

    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: float = 15.0,
    ) -> None:
        if not identity:
            raise ValueError(f"Lease {namespace}/{name}: the candidate's identity is empty")
        self._client = client
        self._namespace = namespace
        self._name = name
        self.identity = identity
        self._lease = lease_seconds
        self.leading = False
        #: Whether the last :meth:`run` ended because the Lease was lost.
        self.lost = False
        self._stop = asyncio.Event()

    @property
    def lease(self) -> str:
        return f"{self._namespace}/{self._name}"

    def stop(self) -> None:
        """Stop campaigning; a leader finishes its work (see ``drain``) and hands over."""
        self._stop.set()

    def _body(self, state: LeaseState | None, now: datetime, version: str) -> Obj:
        taking_over = state is None or state.holder != self.identity
        transitions = (state.transitions if state else 0) + (1 if state and taking_over else 0)
        stamp = now.strftime(_TIME)
        spec: Obj = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self._lease),
            "renewTime": stamp,
            "leaseTransitions": transitions,
        }
        if taking_over:
            spec["acquireTime"] = stamp
        meta: Obj = {"name": self._name, "namespace": self._namespace}
        if version:
            meta["resourceVersion"] = version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": spec,
        }

    async def _read(self) -> Obj | None:
        try:
            return await self._client.get(LEASES, self._name, namespace=self._namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return None

    async def try_hold(self) -> bool:
        """One attempt to acquire or renew; True when this replica holds the Lease after it."""
        now = datetime.now(UTC)
        current = await self._read()
        state = read_lease(current) if current else None
        if not decide(state, me=self.identity, now=now):
            return False
        version = (current or {}).get("metadata", {}).get("resourceVersion", "")
        body = self._body(state, now, version)
        try:
            if current is None:
                await self._client.create(LEASES, body, namespace=self._namespace)
            else:
                await self._client.replace(LEASES, self._name, body, namespace=self._namespace)
        except ApiException as exc:
            if exc.status == 409:  # another candidate won this round
                return False
            raise
        return True

    async def release(self) -> bool:
        """Hand the Lease back if this replica holds it (a standby may take it at once)."""
        current = await self._read()
        if current is None or read_lease(current).holder != self.identity:
            return False
        spec = dict(current.get("spec") or {})
        spec.update(
            holderIdentity="",
            leaseDurationSeconds=1,
            renewTime=datetime.now(UTC).strftime(_TIME),
        )
        body = {**current, "spec": spec}
        try:
            await self._client.replace(LEASES, self._name, body, namespace=self._namespace)
        except ApiException as exc:
            if exc.status == 409:  # taken meanwhile: nothing of ours to give back
                return False
            raise
        return True

    async def _campaign(self, every: float) -> bool:
        """Wait until this replica holds the Lease (True) or stop() was called (False),
        asking every ``every`` seconds."""
        while not self._stop.is_set():
            try:
                if await self.try_hold():
                    return True
            except _TRANSIENT as exc:
                log.warning("lease attempt failed", extra={"lease": self.lease, "error": repr(exc)})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=every)
        return False

    async def run(self, lead: Lead, *, drain: Callable[[], object] | None = None) -> None:
        """Wait for the Lease, run ``lead`` as a task while renewing it; return when the Lease
        is lost, ``lead`` returned, or :meth:`stop` was called.

        On :meth:`stop` a leader calls ``drain`` (which asks ``lead`` to finish what it is
        doing and return) and waits for ``lead`` as long as the Lease is surely still its
        own; without ``drain``, or past that, ``lead`` is cancelled. Then the Lease is handed
        back. When the Lease is lost, ``lead`` is cancelled at once. An exception of ``lead``
        is raised here.
        """
        await self._term(lead, drain=drain, campaign_every=self._lease / 3)

    async def _term(
        self, lead: Lead, *, drain: Callable[[], object] | None, campaign_every: float
    ) -> None:
        """:meth:`run`, campaigning at the pace given."""
        self.lost = False
        if not await self._campaign(campaign_every):
            return
        loop = asyncio.get_running_loop()
        retry = self._lease / 3
        self.leading = True
        LEADING.labels(self._name).set(1)
        log.info("leading", extra={"identity": self.identity, "lease": self.lease})
        task = asyncio.create_task(lead(), name=f"leader-work-{self._name}")
        last_renewal = loop.time()
        lost = False
        try:
            while not self._stop.is_set() and not task.done():
                stopped = asyncio.ensure_future(self._stop.wait())
                await asyncio.wait({stopped, task}, timeout=retry)
                stopped.cancel()
                if self._stop.is_set() or task.done():
                    break
                try:
                    if await self.try_hold():
                        last_renewal = loop.time()
                    else:
                        log.error("lease taken by another replica", extra={"lease": self.lease})
                        lost = True
                        return
                except _TRANSIENT as exc:
                    log.warning(
                        "lease renewal failed", extra={"lease": self.lease, "error": repr(exc)}
                    )
                # Stop before the lease could have expired, so no one else writes meanwhile.
                if loop.time() - last_renewal > self._lease * 2 / 3:
                    log.error("lease not renewed in time", extra={"lease": self.lease})
                    lost = True
                    return
        finally:
            if not task.done() and not lost and drain is not None:
                drain()
                grace = last_renewal + self._lease * 2 / 3 - loop.time()
                if grace > 0:
                    await asyncio.wait({task}, timeout=grace)
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            self.leading = False
            self.lost = lost
            LEADING.labels(self._name).set(0)
            if not lost:
                try:
                    await self.release()
                except _TRANSIENT as exc:
                    log.warning(
                        "lease not handed back", extra={"lease": self.lease, "error": repr(exc)}
                    )
        if not task.cancelled() and (error := task.exception()) is not None:
            raise error

    async def serve(self, lead: Lead, *, drain: Callable[[], object] | None = None) -> None:
        """:meth:`run` again after each lost Lease, until :meth:`stop` or ``lead`` returns.

        ``lead`` must start its work afresh each time it is called (its lists, queues and
        consumers made anew): what it knew when the Lease was lost may be stale. After a loss
        this replica asks for the Lease every second (a candidate's usual pace is a third of
        the lease), so that it leads again within a second of the apiserver's return.
        """
        campaign_every = self._lease / 3
        while True:
            await self._term(lead, drain=drain, campaign_every=campaign_every)
            if self._stop.is_set() or not self.lost:
                return
            campaign_every = min(self._lease / 3, 1.0)
            log.info("campaigning again", extra={"identity": self.identity, "lease": self.lease})
