"""The work queue de-duplicates keys, never hands one key to two workers, and backs off."""

from __future__ import annotations

import asyncio

import pytest
from neuron_dra_common.kube import QueueShutDown, WorkQueue, run_workers


async def test_a_waiting_key_is_queued_once() -> None:
    q: WorkQueue[str] = WorkQueue(name="t")
    for key in ["a", "b", "a", "a"]:
        q.add(key)
    assert len(q) == 2
    assert [await q.get(), await q.get()] == ["a", "b"]


async def test_key_added_while_processing_comes_back_after_done() -> None:
    q: WorkQueue[str] = WorkQueue(name="t")
    q.add("a")
    key = await q.get()
    q.add("a")
    assert len(q) == 0  # not handed to a second worker while the first holds it
    q.done(key)
    assert await asyncio.wait_for(q.get(), 1) == "a"


async def test_backoff_grows_per_key_and_resets_on_forget() -> None:
    q: WorkQueue[str] = WorkQueue(name="t", base_delay=0.01, burst=1000)
    delays = [q.add_rate_limited("a") for _ in range(4)]
    assert delays == pytest.approx([0.01, 0.02, 0.04, 0.08])
    assert q.failures("a") == 4
    q.forget("a")
    assert q.add_rate_limited("a") == pytest.approx(0.01)


async def test_overall_rate_limit_spaces_retries_once_the_bucket_is_empty() -> None:
    q: WorkQueue[str] = WorkQueue(name="t", base_delay=0.0, qps=10, burst=2)
    delays = [q.add_rate_limited(f"k{i}") for i in range(4)]
    assert delays[:2] == [0.0, 0.0]
    assert delays[2] > 0.05
    assert delays[3] > delays[2]


async def test_add_after_queues_later() -> None:
    q: WorkQueue[str] = WorkQueue(name="t")
    q.add_after("a", 0.05)
    assert len(q) == 0
    assert await asyncio.wait_for(q.get(), 1) == "a"


async def test_workers_retry_failures_until_success_then_stop_on_shutdown() -> None:
    q: WorkQueue[str] = WorkQueue(name="t", base_delay=0.01)
    attempts: dict[str, int] = {}

    async def reconcile(key: str) -> None:
        attempts[key] = attempts.get(key, 0) + 1
        if attempts[key] < 3:
            raise RuntimeError(f"{key}: not yet")

    q.add("a")
    q.add("b")
    workers = asyncio.create_task(run_workers(q, reconcile, workers=2))
    for _ in range(200):
        if attempts == {"a": 3, "b": 3}:
            break
        await asyncio.sleep(0.01)
    q.shutdown()
    await asyncio.wait_for(workers, 1)
    assert attempts == {"a": 3, "b": 3}
    assert q.failures("a") == 0
    with pytest.raises(QueueShutDown):
        await q.get()
