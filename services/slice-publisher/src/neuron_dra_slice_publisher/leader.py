"""One writer for every pool: leader election over a ``coordination.k8s.io/v1`` Lease.

Any number of replicas run; the one holding the Lease consumes inventories and writes pools,
the others wait. The holder renews every third of the lease; a replica takes the Lease over
only when it went unrenewed for ``lease_seconds``, with an optimistic (resourceVersion) update
so two candidates can never both win. A leader that cannot renew before its lease ends stops
working at once (the process exits and is restarted as a candidate), so two writers never
overlap by more than the time a write already in flight takes — and such a write still uses
the slice's resourceVersion, so it cannot overwrite the new leader's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import msgspec
from neuron_dra_common.kube import ApiException, KubeClient, Resource

__all__ = ["LEASES", "Elector", "LeaseState", "decide"]

log = logging.getLogger(__name__)

LEASES: Final = Resource(
    group="coordination.k8s.io", version="v1", plural="leases", kind="Lease", namespaced=True
)
_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"

Obj = dict[str, Any]


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
    """May ``me`` write the Lease now (renew it, or take over an expired one)?

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
        self._client = client
        self._namespace = namespace
        self._name = name
        self.identity = identity
        self._lease = lease_seconds
        self.leading = False
        self._stop = asyncio.Event()

    def stop(self) -> None:
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

    async def try_hold(self) -> bool:
        """One attempt to acquire or renew; True when this replica holds the Lease after it."""
        now = datetime.now(UTC)
        path = LEASES.path(namespace=self._namespace, name=self._name)
        try:
            current: Obj | None = await self._client.request("GET", path)
        except ApiException as exc:
            if exc.status != 404:
                raise
            current = None
        state = read_lease(current) if current else None
        if not decide(state, me=self.identity, now=now):
            return False
        version = (current or {}).get("metadata", {}).get("resourceVersion", "")
        body = self._body(state, now, version)
        try:
            if current is None:
                await self._client.request(
                    "POST", LEASES.path(namespace=self._namespace), body=body
                )
            else:
                await self._client.request("PUT", path, body=body)
        except ApiException as exc:
            if exc.status == 409:  # another candidate won this round
                return False
            raise
        return True

    async def run(self, lead: Callable[[], Coroutine[object, object, None]]) -> None:
        """Wait for the Lease, run ``lead`` as a task while renewing; return when lost/stopped."""
        retry = self._lease / 3
        while not self._stop.is_set():
            try:
                if await self.try_hold():
                    break
            except (ApiException, OSError, TimeoutError) as exc:
                log.warning("lease attempt failed", extra={"error": repr(exc)})
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=retry)
            except TimeoutError:
                continue
        if self._stop.is_set():
            return
        self.leading = True
        log.info("leading", extra={"identity": self.identity, "lease": self._name})
        task = asyncio.create_task(lead(), name="leader-work")
        last_renewal = asyncio.get_running_loop().time()
        try:
            while not self._stop.is_set() and not task.done():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), timeout=retry)
                try:
                    if await self.try_hold():
                        last_renewal = asyncio.get_running_loop().time()
                    else:
                        log.error("lease taken by another replica", extra={"lease": self._name})
                        return
                except (ApiException, OSError, TimeoutError) as exc:
                    log.warning("lease renewal failed", extra={"error": repr(exc)})
                # Stop before the lease could have expired, so no one else writes meanwhile.
                if asyncio.get_running_loop().time() - last_renewal > self._lease * 2 / 3:
                    log.error("lease not renewed in time", extra={"lease": self._name})
                    return
        finally:
            self.leading = False
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
