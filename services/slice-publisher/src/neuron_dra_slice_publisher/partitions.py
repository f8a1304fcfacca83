"""Several publishers, each writing a share of the nodes: a Lease per share.

With ``partitions`` N > 1 the NATS server files each node's inventory under one of
:data:`~neuron_dra_common.bus.declarations.INVENTORY_BUCKETS` buckets (the inventory stream's
subject transform); share ``p`` is the buckets whose number leaves ``p`` divided by N. Every
replica campaigns for every share's Lease (``<lease_name>-<p>-of-<N>``) with the shared
elector and, for each it holds, consumes that share's inventories through a durable consumer
of its own and writes those nodes' pools. One writer per share, as safe as the single Lease.

So that two replicas started together split the shares rather than one taking them all, a
replica that already leads a share asks for another only once that share's Lease has been
vacant (absent, released or expired) for a whole Lease duration: a replica holding nothing
takes it first. When a replica dies, another takes its shares once their Leases expire.

No share is led while a Lease of another number of shares is held: during a rollout from one
share to two, the new replicas wait until the old leader let go (or its Lease expired), so a
node never has two writers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime

from neuron_dra_common.bus.declarations import PUBLISHER_SHARES
from neuron_dra_common.kube import KubeClient
from neuron_dra_common.kube.client import UNANSWERED, ApiException

from neuron_dra_slice_publisher.leader import LEASES, Elector, decide, read_lease

__all__ = ["Shares", "lease_names", "other_leases"]

log = logging.getLogger(__name__)

Lead = Callable[[int], Coroutine[object, object, None]]


def lease_names(lease_name: str, partitions: int) -> list[str]:
    """The Lease of each share: the one ``lease_name`` for a single share.

    >>> lease_names("neuron-dra-slice-publisher", 2)
    ['neuron-dra-slice-publisher-0-of-2', 'neuron-dra-slice-publisher-1-of-2']
    """
    if partitions == 1:
        return [lease_name]
    return [f"{lease_name}-{p}-of-{partitions}" for p in range(partitions)]


def other_leases(lease_name: str, partitions: int) -> list[str]:
    """The Leases of every other number of shares: while one is held, publishers configured
    otherwise still write (a rollout from one share to two), and none of these may start."""
    return [
        name
        for n in range(1, PUBLISHER_SHARES + 1)
        if n != partitions
        for name in lease_names(lease_name, n)
    ]


class Shares:
    """Campaigns for every share's Lease; runs ``lead(p)`` for each share ``p`` it holds."""

    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        lease_name: str,
        partitions: int,
        identity: str,
        lease_seconds: float,
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._lease_seconds = lease_seconds
        self.names = lease_names(lease_name, partitions)
        self._others = other_leases(lease_name, partitions)
        self.electors = [
            Elector(
                client,
                namespace=namespace,
                name=name,
                identity=identity,
                lease_seconds=lease_seconds,
            )
            for name in self.names
        ]
        #: The shares this replica leads now.
        self.held: set[int] = set()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()
        for elector in self.electors:
            elector.stop()

    async def serve(self, lead: Lead) -> None:
        """Until :meth:`stop`: lead each share whose Lease this replica holds."""
        await asyncio.gather(*(self._share(p, lead) for p in range(len(self.electors))))

    async def _share(self, p: int, lead: Lead) -> None:
        elector = self.electors[p]

        async def term() -> None:
            self.held.add(p)
            log.info("leading share", extra={"share": p, "lease": elector.lease})
            try:
                await lead(p)
            finally:
                self.held.discard(p)

        if len(self.electors) == 1:
            # One share: today's single Lease, asked for again every second after a loss.
            await self._until(self._others_vacant)
            if not self._stop.is_set():
                await elector.serve(term)
            return
        # The shares of one replica ask one after another, so that the first one taken
        # counts before the next is asked for.
        await self._pause(p * 1.0)
        while not self._stop.is_set():
            await self._until(self._others_vacant)
            if self.held - {p}:
                await self._vacant_for_a_lease(p)
            if self._stop.is_set():
                return
            await elector.run(term)
            if not elector.lost:
                return

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def _vacant(self, name: str) -> bool:
        """Whether Lease ``name`` is absent, released or expired (unknown is not vacant)."""
        try:
            state = read_lease(await self._client.get(LEASES, name, namespace=self._namespace))
        except ApiException as exc:
            return exc.status == 404
        except UNANSWERED:
            return False
        return decide(state, me="", now=datetime.now(UTC))

    async def _others_vacant(self) -> bool:
        for name in self._others:
            if not await self._vacant(name):
                return False
        return True

    async def _until(self, done: Callable[[], Awaitable[bool]]) -> None:
        """Ask ``done`` every third of a Lease duration until it says so (or :meth:`stop`)."""
        while not self._stop.is_set() and not await done():
            await self._pause(self._lease_seconds / 3)

    async def _vacant_for_a_lease(self, p: int) -> None:
        """Return once share ``p``'s Lease has been vacant for a whole Lease duration, or this
        replica holds no other share any more."""
        since: float | None = None

        async def long_enough() -> bool:
            nonlocal since
            if not self.held - {p}:
                return True
            if not await self._vacant(self.names[p]):
                since = None
                return False
            since = since or time.monotonic()
            return time.monotonic() - since >= self._lease_seconds

        await self._until(long_enough)
