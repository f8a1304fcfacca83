"""Each preparation of a claim on a node is told under an id of its own; a change told again
keeps the id it had. Real preparers on a real checkpoint, the ledger in a real file, and
processes that die at every step."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest
from neuron_dra_common.events.base import Event
from neuron_dra_kubelet_plugin.faults import STEPS
from neuron_dra_kubelet_plugin.told import KEEP_UNPREPARED, ToldLedger

from tests.unit.kubelet_plugin.support import Killed, TellingProcess

P1, U1 = "claim-prepared/n1/u1/b1", "claim-unprepared/n1/u1/b1"
P2, U2 = f"{P1}/2", f"{U1}/2"


async def test_each_preparation_has_its_own_id_and_a_change_told_again_keeps_it(
    tmp_path: Path,
) -> None:
    node = TellingProcess(tmp_path)
    await node.prepare()
    await node.prepare()  # the kubelet asks again: answered from the checkpoint
    await node.unprepare()
    await node.unprepare()  # again: no entry left
    await node.prepare()  # the claim's next pod on this node
    await node.unprepare()
    assert await node.told() == [P1, P1, U1, U1, P2, U2]


async def test_the_ledger_is_shared_by_processes_and_survives_a_restart(tmp_path: Path) -> None:
    first = TellingProcess(tmp_path)
    await first.prepare()
    await first.unprepare()
    assert await first.told() == [P1, U1]
    second = TellingProcess(tmp_path)  # restarted, or the new pod of a rolling update
    await second.prepare()
    assert await second.told() == [P2]


@pytest.mark.parametrize("step", [s for s in STEPS if s.startswith("prepare:")])
async def test_a_preparation_a_killed_process_did_not_tell_is_told_under_the_new_id(
    tmp_path: Path, step: str
) -> None:
    earlier = TellingProcess(tmp_path)
    await earlier.prepare()
    await earlier.unprepare()
    dying = TellingProcess(tmp_path, dies_at=step)
    with pytest.raises(Killed):
        await dying.prepare()
    assert await dying.told() == []
    retry = TellingProcess(tmp_path)
    await retry.prepare()
    assert await retry.told() == [P2]


@pytest.mark.parametrize("step", [s for s in STEPS if s.startswith("unprepare:")])
async def test_an_unprepare_a_killed_process_did_not_tell_is_told_under_its_preparations_id(
    tmp_path: Path, step: str
) -> None:
    earlier = TellingProcess(tmp_path)
    await earlier.prepare()
    await earlier.unprepare()
    await earlier.prepare()
    dying = TellingProcess(tmp_path, dies_at=step)
    with pytest.raises(Killed):
        await dying.unprepare()
    retry = TellingProcess(tmp_path)
    await retry.unprepare()
    assert (await earlier.told())[-1] == P2
    assert await retry.told() == [U2]


async def test_after_a_reboot_every_claim_starts_over(tmp_path: Path) -> None:
    before = TellingProcess(tmp_path)
    await before.prepare()
    await before.unprepare()
    await before.prepare()
    assert (await before.told())[-1] == P2
    after = TellingProcess(tmp_path, boot="b2")  # its stale entry is dropped at recovery
    await after.prepare()
    assert await after.told() == ["claim-prepared/n1/u1/b2"]


def test_an_unreadable_ledger_is_replaced(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "told.json"
    path.write_bytes(b"{not json")
    ledger = ToldLedger(path, boot_id="b1")
    assert ledger.prepared("u1", again=False) == 1
    assert "claim event ledger unreadable" in caplog.text
    assert ToldLedger(path, boot_id="b1").unprepared("u1") == 1


def test_it_forgets_the_oldest_claims_told_unprepared_and_keeps_the_prepared_and_owed() -> None:
    ledger = ToldLedger(None, boot_id="b1")
    ledger.prepared("held", again=False)
    ledger.prepared("owed", again=False)
    ledger.unprepared("owed")
    for i in range(KEEP_UNPREPARED + 1):
        ledger.prepared(f"c{i}", again=False)
        ledger.unprepared(f"c{i}")
        ledger.published([(f"c{i}", 1, "unprepared")])
    assert [t.uid for t in ledger.told() if not t.published] == ["held", "owed"]
    assert ledger.prepared("c0", again=False) == 1  # forgotten: starts over
    assert ledger.prepared(f"c{KEEP_UNPREPARED}", again=False) == 2
    assert ledger.prepared("held", again=True) == 1


async def test_an_event_queued_by_a_process_that_died_is_told_at_the_next_start(
    tmp_path: Path,
) -> None:
    """The kubelet got its answer, the event was still in the queue: nobody asks again."""
    dead = TellingProcess(tmp_path)
    await dead.prepare()  # queued, never published
    starting = TellingProcess(tmp_path)
    assert starting.events.tell_owed(starting.preparer.checkpoint) == 1
    assert await starting.told() == [P1]
    again = TellingProcess(tmp_path)
    assert again.events.tell_owed(again.preparer.checkpoint) == 0

    dead = TellingProcess(tmp_path)
    await dead.unprepare()
    starting = TellingProcess(tmp_path)
    assert starting.events.tell_owed(starting.preparer.checkpoint) == 1
    assert await starting.told() == [U1]


async def test_what_the_bus_refused_stays_owed(tmp_path: Path) -> None:
    class Refusing:
        async def publish_many(
            self, events: Sequence[Event], *, msg_ids: Sequence[str] | None = None
        ) -> object:
            raise TimeoutError("nats: timeout")

    node = TellingProcess(tmp_path)
    await node.prepare()
    node.events.attach(Refusing())
    node.events.stop()
    await asyncio.wait_for(node.events.run(), 5)
    starting = TellingProcess(tmp_path)
    assert starting.events.tell_owed(starting.preparer.checkpoint) == 1
    assert await starting.told() == [P1]


async def test_nothing_is_owed_for_a_claim_that_changed_since(tmp_path: Path) -> None:
    """A prepare owed, then unprepared by another process: only the unprepare is told."""
    dead = TellingProcess(tmp_path)
    await dead.prepare()
    other = TellingProcess(tmp_path)
    await other.unprepare()
    assert await other.told() == [U1]
    starting = TellingProcess(tmp_path)
    assert starting.events.tell_owed(starting.preparer.checkpoint) == 0


@pytest.mark.parametrize(
    ("step", "expected"),
    [("prepare:completed-saved", [P2]), ("unprepare:entry-dropped", [U1])],
)
async def test_a_change_on_disk_no_process_told_is_told_at_the_next_start(
    tmp_path: Path, step: str, expected: list[str]
) -> None:
    """The process died between the disk and the ledger, and the kubelet did not ask again
    (it had gone on, or restarted without the pod): the next start tells what the disk says."""
    earlier = TellingProcess(tmp_path)
    await earlier.prepare()
    if step.startswith("prepare:"):
        await earlier.unprepare()
    assert await earlier.told()  # all published
    dying = TellingProcess(tmp_path, dies_at=step)
    change = dying.prepare if step.startswith("prepare:") else dying.unprepare
    with pytest.raises(Killed):
        await change()
    starting = TellingProcess(tmp_path)
    assert starting.events.tell_owed(starting.preparer.checkpoint) == 1
    assert await starting.told() == expected


def test_two_live_processes_read_each_others_changes(tmp_path: Path) -> None:
    """The old and the new pod of a rolling update, both running: each change of one is
    seen by the other's next change."""
    old = ToldLedger(tmp_path / "told.json", boot_id="b1")
    new = ToldLedger(tmp_path / "told.json", boot_id="b1")
    assert old.prepared("u1", again=False) == 1
    assert new.unprepared("u1") == 1
    assert old.prepared("u1", again=False) == 2
    assert new.prepared("u1", again=True) == 2
    old.published([("u1", 2, "prepared")])
    old.flush()
    assert [t.published for t in new.told()] == [True]
