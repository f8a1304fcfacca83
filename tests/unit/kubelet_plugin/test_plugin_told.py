"""A claim's prepared and unprepared events survive a process that dies before telling them.

The plugin writes a change to disk, then tells it (the listener queues the event for the
bus). A process killed in between leaves the change on disk and the event untold; the kubelet
asks again, on the same process restarted or on the other pod of a rolling update, and that
answer, from the disk, must tell it again, under the same event id.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from neuron_dra_kubelet_plugin.checkpoint import CheckpointStore, ClaimEntry
from neuron_dra_kubelet_plugin.claims import ClaimRef
from neuron_dra_kubelet_plugin.faults import STEPS
from neuron_dra_kubelet_plugin.preparer import Effects, NodePreparer

from tests.unit.kubelet_plugin.support import (
    Killed,
    MemoryClaims,
    make_claim,
    ref_of,
    trn2_node,
)


class Told:
    """What every process on the node told, in order, as (what, claim UID)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def prepared(self, entry: ClaimEntry) -> None:
        self.events.append(("prepared", entry.uid))

    def unprepared(self, entry: ClaimEntry) -> None:
        self.events.append(("unprepared", entry.uid))

    def told_prepared(self, entry: ClaimEntry) -> None:
        self.events.append(("prepared", entry.uid))

    def told_unprepared(self, ref: ClaimRef) -> None:
        self.events.append(("unprepared", ref.uid))

    def last(self, uid: str) -> str | None:
        said = [what for what, about in self.events if about == uid]
        return said[-1] if said else None


def _process(root: Path, claims: MemoryClaims, told: Told, *, dies_at: str = "") -> NodePreparer:
    def crash(step: str) -> None:
        if step == dies_at:
            raise Killed(step)

    preparer = NodePreparer(
        node=trn2_node(),
        claims=claims,
        effects=Effects(store=CheckpointStore(root / "checkpoint.json"), cdi_root=root / "cdi"),
        boot_id="b1",
        listener=told,
        crash=crash,
    )
    preparer.recover()
    return preparer


@pytest.mark.parametrize("step", STEPS)
async def test_the_kubelets_retry_tells_what_a_killed_process_did_not(
    tmp_path: Path, step: str
) -> None:
    claim = make_claim("u1", [0, 1, 2, 3], name="c1")
    claims = MemoryClaims([claim])
    told = Told()
    dying = _process(tmp_path, claims, told, dies_at=step)
    other = _process(tmp_path, claims, told)
    if step.startswith("prepare:"):
        with pytest.raises(Killed):
            await dying.prepare(ref_of(claim))
        await other.prepare(ref_of(claim))  # the kubelet's retry
        assert told.last("u1") == "prepared"
    else:
        await other.prepare(ref_of(claim))
        with pytest.raises(Killed):
            await dying.unprepare(ref_of(claim))
        await other.unprepare(ref_of(claim))  # the kubelet's retry
        assert told.last("u1") == "unprepared"
        assert "u1" not in other.checkpoint.claims


async def test_a_prepare_answered_from_disk_tells_the_same_devices(tmp_path: Path) -> None:
    claim = make_claim("u1", [4, 5, 6, 7], name="c1")
    told = Told()
    preparer = _process(tmp_path, MemoryClaims([claim]), told)
    first = await preparer.prepare(ref_of(claim))
    assert await preparer.prepare(ref_of(claim)) == first
    assert told.events == [("prepared", "u1"), ("prepared", "u1")]
