"""Message ids and CloudEvents times: unique, uuid-sized, cheap in runs; RFC 3339 in UTC."""

from __future__ import annotations

from datetime import datetime, timedelta

from neuron_dra_common.bus.headers import ce_time, new_msg_id, new_msg_ids


def test_msg_ids_are_unique_and_uuid_sized() -> None:
    ids = {new_msg_id() for _ in range(10_000)}
    ids.update(new_msg_ids(10_000))  # in runs, across the 4096 boundaries of the table
    ids.add(new_msg_id())
    assert len(ids) == 20_001
    assert {len(i) for i in ids} == {32}
    assert all(int(i, 16) >= 0 for i in ids)


def test_msg_ids_of_a_run_count_up() -> None:
    run = new_msg_ids(5000)
    numbers = [int(i[16:], 16) for i in run]
    assert numbers == list(range(numbers[0], numbers[0] + 5000))
    assert {i[:16] for i in run} == {new_msg_id()[:16]}


def test_ce_time_is_rfc3339_in_utc_now() -> None:
    stamp = datetime.fromisoformat(ce_time())
    assert stamp.utcoffset() == timedelta(0)
    assert abs((datetime.now(stamp.tzinfo) - stamp).total_seconds()) < 1
