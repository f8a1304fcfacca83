"""Leader election over a Lease on the real apiserver: one candidate leads, a stopped leader
finishes its work and hands over at once, and a leader that loses the Lease or cannot renew
it stops its work before anyone else could start."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime

import pytest
from neuron_dra_common.kube import LEASES, Elector, KubeClient
from neuron_dra_common.kube.leader import read_lease

from tests.contracts.support import wait_until
from tests.fixtures.stack import KubeStack
from tests.integration.kube.relay import relayed

pytestmark = pytest.mark.stack

NS = "default"
LEASE = 3.0


class Work:
    """A leader's work: records whether it ran, finished when drained, or was cancelled."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.drained = asyncio.Event()
        self.outcome = ""

    def drain(self) -> None:
        self.drained.set()

    def lead(self) -> Callable[[], Coroutine[object, object, None]]:
        async def run() -> None:
            self.started.set()
            try:
                await self.drained.wait()
                self.outcome = "drained"
            except asyncio.CancelledError:
                self.outcome = "cancelled"
                raise

        return run


def elector(client: KubeClient, name: str, identity: str) -> Elector:
    return Elector(client, namespace=NS, name=name, identity=identity, lease_seconds=LEASE)


async def holder(client: KubeClient, name: str) -> str:
    return read_lease(await client.get(LEASES, name, namespace=NS)).holder


async def test_one_leads_and_a_stopped_leader_hands_over_at_once(kube: KubeClient) -> None:
    name = f"lead-{uuid.uuid4().hex[:8]}"
    a, b = elector(kube, name, "a"), elector(kube, name, "b")
    work_a, work_b = Work(), Work()
    run_a = asyncio.create_task(a.run(work_a.lead(), drain=work_a.drain))
    await asyncio.wait_for(work_a.started.wait(), 15)
    run_b = asyncio.create_task(b.run(work_b.lead(), drain=work_b.drain))
    try:
        await asyncio.sleep(LEASE * 1.5)  # several renewals and campaign rounds
        assert a.leading
        assert not b.leading
        assert not work_b.started.is_set()
        assert await holder(kube, name) == "a"

        a.stop()
        await asyncio.wait_for(run_a, 10)
        assert work_a.outcome == "drained", "a stopped leader finishes its work"
        # Handed back: b takes over within one campaign round, not after the lease.
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(work_b.started.wait(), LEASE)
        assert asyncio.get_running_loop().time() - started < LEASE
        assert await holder(kube, name) == "b"
    finally:
        b.stop()
        a.stop()
        await asyncio.gather(run_a, run_b, return_exceptions=True)
        await kube.delete(LEASES, name, namespace=NS)


async def test_a_leader_whose_lease_is_taken_stops_its_work(kube: KubeClient) -> None:
    name = f"taken-{uuid.uuid4().hex[:8]}"
    a = elector(kube, name, "a")
    work = Work()
    run = asyncio.create_task(a.run(work.lead(), drain=work.drain))
    try:
        await asyncio.wait_for(work.started.wait(), 15)
        lease = await kube.get(LEASES, name, namespace=NS)
        lease["spec"].update(
            holderIdentity="intruder",
            leaseDurationSeconds=60,
            renewTime=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        )
        await kube.replace(LEASES, name, lease, namespace=NS)
        await asyncio.wait_for(run, LEASE)
        assert work.outcome == "cancelled"
        assert not a.leading
        assert await holder(kube, name) == "intruder", "a lost Lease is not handed back"
    finally:
        a.stop()
        await asyncio.gather(run, return_exceptions=True)
        await kube.delete(LEASES, name, namespace=NS)


async def test_a_leader_that_cannot_renew_stops_before_its_lease_ends(
    kube: KubeClient, kube_stack: KubeStack
) -> None:
    name = f"cut-{uuid.uuid4().hex[:8]}"
    relay, _, cut_off = await relayed(kube_stack)
    a = elector(cut_off, name, "a")
    work = Work()
    run = asyncio.create_task(a.run(work.lead(), drain=work.drain))
    try:
        await asyncio.wait_for(work.started.wait(), 15)
        lease = read_lease(await kube.get(LEASES, name, namespace=NS))
        assert lease.holder == "a"
        assert lease.renewed is not None
        await relay.cut()
        await asyncio.wait_for(run, LEASE * 2)
        stopped = datetime.now(UTC)
        assert work.outcome == "cancelled"
        # The work stopped before the lease it last renewed ran out.
        last = read_lease(await kube.get(LEASES, name, namespace=NS))
        assert last.holder == "a"
        assert last.renewed is not None
        assert (stopped - last.renewed).total_seconds() < LEASE
        # And another candidate takes it over once it expired.
        b = elector(kube, name, "b")
        await asyncio.sleep(max(0.0, LEASE - (datetime.now(UTC) - last.renewed).total_seconds()))
        assert await b.try_hold()
    finally:
        a.stop()
        await asyncio.gather(run, return_exceptions=True)
        await cut_off.close()
        await kube.delete(LEASES, name, namespace=NS)


async def test_a_leader_cut_off_leads_again_as_soon_as_the_apiserver_answers(
    kube: KubeClient, kube_stack: KubeStack
) -> None:
    name = f"back-{uuid.uuid4().hex[:8]}"
    relay, relay_port, cut_off = await relayed(kube_stack)
    a = elector(cut_off, name, "a")
    terms: list[Work] = []
    began = asyncio.Event()

    async def lead() -> None:
        work = Work()
        terms.append(work)
        began.set()
        await work.lead()()

    serving = asyncio.create_task(a.serve(lead))
    try:
        await asyncio.wait_for(began.wait(), 15)
        began.clear()
        await relay.cut()
        # The first term's work stops before the lease it last renewed runs out ...
        await wait_until(
            lambda: not a.leading and terms[0].outcome == "cancelled",
            within=LEASE * 2,
            what="the first term's work cancelled",
        )
        assert not serving.done(), "serve() must campaign again, not return"
        await relay.start(relay_port)
        back = asyncio.get_running_loop().time()
        # ... and a second term begins about a second after the apiserver answers again,
        # under the same holder (no one else could write the Lease meanwhile).
        await asyncio.wait_for(began.wait(), LEASE * 2)
        assert asyncio.get_running_loop().time() - back < LEASE
        assert len(terms) == 2
        assert a.leading
        assert await holder(kube, name) == "a"
    finally:
        a.stop()
        for work in terms:
            work.drain()
        await asyncio.gather(serving, return_exceptions=True)
        await cut_off.close()
        await relay.cut()
        await kube.delete(LEASES, name, namespace=NS)
    assert serving.exception() is None


async def test_the_librarys_elector_keeps_the_lease_when_stopped_ours_hands_it_over(
    kube: KubeClient,
) -> None:
    """Why the product keeps its own Elector rather than kubernetes-asyncio's LeaderElection.

    The library's elector has no stop: the only way to end it is to cancel ``run()``, which
    neither releases the Lease (a standby waits out the whole lease) nor stops the leader's
    work (its task keeps running, orphaned). Ours, stopped the same way a service stops on
    SIGTERM, hands the Lease over and the standby leads at once.
    """
    from kubernetes_asyncio.client import ApiClient
    from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
    from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

    lease_seconds = 15  # the library writes it with int(str(...)): a float fails
    name = f"library-{uuid.uuid4().hex[:8]}"
    api = ApiClient(kube.config.configuration)
    theirs = Work()
    config = electionconfig.Config(
        LeaseLock(name, NS, "library-a", api),
        lease_duration=lease_seconds,
        renew_deadline=10,
        retry_period=2,
        onstarted_leading=theirs.lead(),
        onstopped_leading=None,  # type: ignore[arg-type]
    )
    running = asyncio.create_task(leaderelection.LeaderElection(config).run())
    try:
        await asyncio.wait_for(theirs.started.wait(), 15)
        running.cancel()  # what stopping the service does to it
        await asyncio.gather(running, return_exceptions=True)
        stopped_at = asyncio.get_running_loop().time()
        standby = Elector(kube, namespace=NS, name=name, identity="b", lease_seconds=lease_seconds)
        assert await holder(kube, name) == "library-a", "the Lease was not handed back"
        assert not await standby.try_hold(), "the standby must wait for the lease to run out"
        assert asyncio.get_running_loop().time() - stopped_at < lease_seconds
        assert theirs.outcome == "", "the leader's work was neither drained nor cancelled"
    finally:
        theirs.drain()
        await asyncio.sleep(0)
        await api.close()

    # The same hand-over with ours: the standby leads as soon as the leader stopped.
    ours_name = f"ours-{uuid.uuid4().hex[:8]}"
    a = Elector(kube, namespace=NS, name=ours_name, identity="a", lease_seconds=lease_seconds)
    b = Elector(kube, namespace=NS, name=ours_name, identity="b", lease_seconds=lease_seconds)
    work = Work()
    run = asyncio.create_task(a.run(work.lead(), drain=work.drain))
    await asyncio.wait_for(work.started.wait(), 15)
    a.stop()
    await asyncio.wait_for(run, 10)
    assert work.outcome == "drained"
    assert await b.try_hold(), "the standby takes over at once"
    await b.release()
