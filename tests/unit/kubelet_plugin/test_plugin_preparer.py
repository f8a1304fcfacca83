"""The preparer against a real directory: idempotence, exclusivity, crash at every step."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from neuron_dra_common import cdi
from neuron_dra_kubelet_plugin.checkpoint import Change, Checkpoint, CheckpointStore, ClaimState
from neuron_dra_kubelet_plugin.claims import ClaimRef, ResourceClaim
from neuron_dra_kubelet_plugin.plan import PrepareError
from neuron_dra_kubelet_plugin.preparer import Effects, NodePreparer

from tests.unit.kubelet_plugin.support import (
    MemoryClaims,
    make_claim,
    ref_of,
    trn2_node,
    trn2u_node,
)


class Crash(Exception):
    """The process dies here."""


class CountingStore(CheckpointStore):
    """Counts the bases written (each a full rewrite of the checkpoint)."""

    saves = 0

    def save(self, checkpoint: Checkpoint) -> None:
        self.saves += 1
        super().save(checkpoint)


class CrashingEffects(Effects):
    """Effects that die before the ``crash_at``-th side effect (never when ``None``)."""

    def __init__(self, root: Path, crash_at: int | None = None) -> None:
        self.counting = CountingStore(root / "checkpoint.json")
        super().__init__(store=self.counting, cdi_root=root / "cdi")
        self.crash_at = crash_at
        self.steps = 0

    def _step(self) -> None:
        if self.crash_at is not None and self.steps == self.crash_at:
            raise Crash
        self.steps += 1

    def save(self, checkpoint: Checkpoint) -> None:
        self._step()
        super().save(checkpoint)

    def append(self, changes: list[Change], current: Checkpoint) -> None:
        self._step()
        super().append(changes, current)

    def write_spec(self, uid: str, spec: cdi.Spec) -> None:
        self._step()
        super().write_spec(uid, spec)

    def remove_spec(self, uid: str) -> None:
        self._step()
        super().remove_spec(uid)


def start(
    root: Path, claims: MemoryClaims, *, crash_at: int | None = None, boot: str = "b1"
) -> NodePreparer:
    preparer = NodePreparer(
        node=trn2_node(), claims=claims, effects=CrashingEffects(root, crash_at), boot_id=boot
    )
    preparer.recover()
    return preparer


def assert_consistent(root: Path, preparer: NodePreparer) -> None:
    """Disk and checkpoint agree; no device is held twice; nothing is half done."""
    checkpoint = CheckpointStore(root / "checkpoint.json").load()
    assert checkpoint == preparer.checkpoint
    assert cdi.claim_spec_uids(root / "cdi") == set(checkpoint.claims)
    held = [(d.pool, d.device) for e in checkpoint.claims.values() for d in e.devices]
    assert len(held) == len(set(held))
    assert all(e.state is ClaimState.PREPARE_COMPLETED for e in checkpoint.claims.values())


async def test_prepare_is_idempotent_and_unprepare_cleans_up(tmp_path: Path) -> None:
    claim = make_claim("u1", [0, 1, 2, 3])
    preparer = start(tmp_path, MemoryClaims([claim]))
    first = await preparer.prepare(ref_of(claim))
    assert await preparer.prepare(ref_of(claim)) == first
    assert cdi.read_claim_spec(tmp_path / "cdi", "u1") is not None
    await preparer.unprepare(ref_of(claim))
    await preparer.unprepare(ref_of(claim))
    assert cdi.claim_spec_uids(tmp_path / "cdi") == set()
    assert preparer.checkpoint == Checkpoint()


async def test_unprepare_works_when_the_claim_is_gone(tmp_path: Path) -> None:
    claims = MemoryClaims([make_claim("u1", [0])])
    preparer = start(tmp_path, claims)
    await preparer.prepare(ClaimRef(namespace="default", name="claim-u1", uid="u1"))
    claims.claims.clear()
    await preparer.unprepare(ClaimRef(namespace="default", name="claim-u1", uid="u1"))
    assert_consistent(tmp_path, preparer)
    assert preparer.checkpoint == Checkpoint()


async def test_missing_claim_is_a_per_claim_error(tmp_path: Path) -> None:
    preparer = start(tmp_path, MemoryClaims())
    with pytest.raises(PrepareError, match="ResourceClaim ns/c: not found"):
        await preparer.prepare(ClaimRef(namespace="ns", name="c", uid="u9"))


async def test_concurrent_claims_for_one_device_get_it_once(tmp_path: Path) -> None:
    claims = [make_claim(f"u{i}", [5], name=f"c{i}") for i in range(6)]
    preparer = start(tmp_path, MemoryClaims(claims))
    results = await asyncio.gather(
        *(preparer.prepare(ref_of(c)) for c in claims), return_exceptions=True
    )
    assert sum(not isinstance(r, BaseException) for r in results) == 1
    assert all(isinstance(r, PrepareError) for r in results if isinstance(r, BaseException))
    assert_consistent(tmp_path, preparer)


class Reported:
    """Collects what the plugin reports as pod events for failed prepares."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def failed(self, claim: ResourceClaim, message: str) -> None:
        self.messages.append(message)


async def test_the_whole_node_and_one_of_its_chips_never_prepare_together(tmp_path: Path) -> None:
    chip = make_claim("u1", [3], name="chip")
    whole = make_claim("u2", ["neuronnode"], name="whole")
    reported = Reported()
    preparer = NodePreparer(
        node=trn2u_node(),
        claims=MemoryClaims([chip, whole]),
        effects=CrashingEffects(tmp_path),
        boot_id="b1",
        reporter=reported,
    )
    preparer.recover()
    await preparer.prepare(ref_of(chip))
    with pytest.raises(PrepareError) as refused:
        await preparer.prepare(ref_of(whole))
    assert str(refused.value) == (
        "ResourceClaim default/whole: device neuronnode holds neurondevice3, which is already "
        "prepared for ResourceClaim default/chip (u1)"
    )
    assert reported.messages == [str(refused.value)]
    assert cdi.claim_spec_uids(tmp_path / "cdi") == {"u1"}
    assert_consistent(tmp_path, preparer)
    # Once the chip is released the whole node prepares, and then the chip is refused.
    await preparer.unprepare(ref_of(chip))
    assert len(await preparer.prepare(ref_of(whole))) == 1
    with pytest.raises(PrepareError, match="neurondevice3 is part of neuronnode"):
        await preparer.prepare(ref_of(chip))
    assert_consistent(tmp_path, preparer)


async def test_changes_are_appended_to_the_journal_not_rewritten(tmp_path: Path) -> None:
    claims = [make_claim(f"u{i}", [i], name=f"c{i}") for i in range(8)]
    effects = CrashingEffects(tmp_path)
    preparer = NodePreparer(
        node=trn2_node(), claims=MemoryClaims(claims), effects=effects, boot_id="b1"
    )
    preparer.recover()
    await asyncio.gather(*(preparer.prepare(ref_of(c)) for c in claims))
    # The first change writes the base (no journal was open); the other fifteen are appends.
    assert effects.counting.saves == 1
    base = (tmp_path / "checkpoint.json").read_bytes()
    assert_consistent(tmp_path, preparer)
    await asyncio.gather(*(preparer.unprepare(ref_of(c)) for c in claims))
    assert (tmp_path / "checkpoint.json").read_bytes() == base
    assert_consistent(tmp_path, preparer)
    assert preparer.checkpoint == Checkpoint()


async def test_a_long_journal_is_folded_into_a_new_base(tmp_path: Path) -> None:
    claim = make_claim("u1", [0, 1])
    effects = CrashingEffects(tmp_path)
    effects.counting = effects.store = CountingStore(
        tmp_path / "checkpoint.json", journal_limit=2048
    )
    preparer = NodePreparer(
        node=trn2_node(), claims=MemoryClaims([claim]), effects=effects, boot_id="b1"
    )
    preparer.recover()
    for _ in range(20):
        await preparer.prepare(ref_of(claim))
        await preparer.unprepare(ref_of(claim))
    await preparer.prepare(ref_of(claim))
    assert effects.counting.saves > 1
    assert (tmp_path / "checkpoint.json.journal").stat().st_size < 2048 + 1024
    assert_consistent(tmp_path, preparer)


async def test_reboot_invalidates_entries(tmp_path: Path) -> None:
    claim = make_claim("u1", [0])
    await start(tmp_path, MemoryClaims([claim])).prepare(ref_of(claim))
    after_reboot = start(tmp_path, MemoryClaims([claim]), boot="b2")
    assert after_reboot.checkpoint == Checkpoint()
    other = make_claim("u2", [0])
    after_reboot_claims = MemoryClaims([other])
    again = start(tmp_path, after_reboot_claims, boot="b2")
    assert (await again.prepare(ref_of(other)))[0].device == "neurondevice0"


async def test_corrupted_checkpoint_is_rebuilt_from_cdi_specs(tmp_path: Path) -> None:
    claim = make_claim("u1", [3])
    await start(tmp_path, MemoryClaims([claim])).prepare(ref_of(claim))
    (tmp_path / "checkpoint.json").write_bytes(b"\x00garbage")
    preparer = NodePreparer(
        node=trn2_node(),
        claims=MemoryClaims([claim]),
        effects=CrashingEffects(tmp_path),
        boot_id="b1",
    )
    recovery = preparer.recover()
    assert recovery.checkpoint_error is not None
    assert "not a checkpoint file" in recovery.checkpoint_error
    assert [d.device for d in preparer.checkpoint.claims["u1"].devices] == ["neurondevice3"]
    intruder = make_claim("u2", [3])
    preparer_claims = MemoryClaims([intruder])
    again = NodePreparer(
        node=trn2_node(), claims=preparer_claims, effects=CrashingEffects(tmp_path), boot_id="b1"
    )
    again.recover()
    with pytest.raises(PrepareError, match="already prepared for ResourceClaim default/claim-u1"):
        await again.prepare(ref_of(intruder))


# Operations: (prepare | unprepare, claim index); claims overlap on purpose.
CLAIM_DEVICES = [[0, 1, 2, 3], [4, 5, 6, 7], [2, 3], [0, 1, 2, 3, 4, 5, 6, 7], [15]]
ops = st.lists(
    st.tuples(st.sampled_from(["prepare", "unprepare"]), st.integers(0, len(CLAIM_DEVICES) - 1)),
    min_size=1,
    max_size=8,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(operations=ops, crash_at=st.integers(0, 12))
def test_a_crash_at_any_step_converges_after_restart(
    operations: list[tuple[str, int]], crash_at: int
) -> None:
    claims = [make_claim(f"u{i}", d, name=f"c{i}") for i, d in enumerate(CLAIM_DEVICES)]
    source = MemoryClaims(claims)

    async def run(preparer: NodePreparer, op: str, i: int) -> None:
        ref = ref_of(claims[i])
        if op == "prepare":
            # A device held by another claim is refused, never shared.
            with contextlib.suppress(PrepareError):
                await preparer.prepare(ref)
        else:
            await preparer.unprepare(ref)

    async def scenario(root: Path) -> None:
        preparer = start(root, source, crash_at=crash_at)
        crashed_at: int | None = None
        for n, (op, i) in enumerate(operations):
            try:
                await run(preparer, op, i)
            except Crash:
                crashed_at = n
                break
        # Restart: a fresh process recovers from what is on disk, then the kubelet retries.
        preparer = start(root, source)
        assert_consistent(root, preparer)
        if crashed_at is not None:
            op, i = operations[crashed_at]
            await run(preparer, op, i)
            for op, i in operations[crashed_at + 1 :]:
                await run(preparer, op, i)
        assert_consistent(root, preparer)
        # Whatever happened, preparing again is idempotent.
        for uid, entry in preparer.checkpoint.claims.items():
            ref = ClaimRef(namespace=entry.namespace, name=entry.name, uid=uid)
            assert await preparer.prepare(ref) == entry.devices

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(Path(tmp)))
