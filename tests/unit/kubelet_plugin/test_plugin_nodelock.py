"""The node lock and two preparers sharing one checkpoint, as two pods of a rolling update do."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from neuron_dra_common import cdi
from neuron_dra_kubelet_plugin.checkpoint import Checkpoint, CheckpointStore
from neuron_dra_kubelet_plugin.nodelock import NodeLock, NodeLockTimeout, lock_path_for
from neuron_dra_kubelet_plugin.plan import PrepareError
from neuron_dra_kubelet_plugin.preparer import Effects, NodePreparer

from tests.unit.kubelet_plugin.support import MemoryClaims, make_claim, ref_of, trn2_node


def preparer(root: Path, claims: MemoryClaims, *, timeout: float = 5.0) -> NodePreparer:
    store = CheckpointStore(root / "checkpoint.json")
    lock = NodeLock(lock_path_for(store.path), timeout=timeout)
    plugin = NodePreparer(
        node=trn2_node(),
        claims=claims,
        effects=Effects(store=store, cdi_root=root / "cdi", lock=lock),
        boot_id="b1",
    )
    plugin.recover()
    return plugin


@contextlib.contextmanager
def held_by_another_process(path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The lock held by a child process until the block ends."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
            str(path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert holder.stdout is not None
    assert holder.stdin is not None
    try:
        assert holder.stdout.readline() == b"held\n"
        yield holder
    finally:
        holder.stdin.close()
        holder.wait(30)
        holder.stdout.close()


async def test_a_prepare_waits_while_another_process_holds_the_lock(tmp_path: Path) -> None:
    claim = make_claim("u1", [0])
    plugin = preparer(tmp_path, MemoryClaims([claim]))
    with held_by_another_process(tmp_path / "checkpoint.json.lock"):
        waiting = asyncio.create_task(plugin.prepare(ref_of(claim)))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        assert cdi.claim_spec_uids(tmp_path / "cdi") == set()
    assert [d.device for d in await asyncio.wait_for(waiting, 10)] == ["neurondevice0"]


async def test_a_lock_held_too_long_fails_the_claim_naming_the_lock(tmp_path: Path) -> None:
    claim = make_claim("u1", [0])
    plugin = preparer(tmp_path, MemoryClaims([claim]), timeout=0.2)
    with held_by_another_process(tmp_path / "checkpoint.json.lock"):
        with pytest.raises(PrepareError) as refused:
            await plugin.prepare(ref_of(claim))
        with pytest.raises(NodeLockTimeout, match="another plugin process has held it"):
            plugin.recover()
    assert str(refused.value) == (
        f"ResourceClaim default/claim-u1: node lock {tmp_path}/checkpoint.json.lock: another "
        "plugin process has held it for more than 0.2 s"
    )
    assert plugin.checkpoint == Checkpoint()


def test_a_dead_holder_leaves_the_node_unlocked(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json.lock"
    with held_by_another_process(path) as holder:
        holder.kill()
        holder.wait(30)
    with NodeLock(path, timeout=1).held_now():
        fd = os.open(path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)


def test_the_store_knows_when_another_process_wrote(tmp_path: Path) -> None:
    mine, theirs = (CheckpointStore(tmp_path / "checkpoint.json") for _ in range(2))
    assert not mine.is_current()  # nothing written yet: load before changing
    mine.save(Checkpoint())
    assert mine.is_current()
    theirs.load()
    theirs.save(Checkpoint())
    assert not mine.is_current()
    mine.load()
    assert not mine.is_current()
    mine.save(Checkpoint())
    assert mine.is_current()
    theirs.load()
    theirs.append([], Checkpoint())  # their first change after a load writes a new base
    assert not mine.is_current()


# Operations of two plugin processes: (which one, prepare | unprepare, claim index).
CLAIM_DEVICES = [[0, 1], [1, 2], [3], [0, 1, 2, 3], [4]]
ops = st.lists(
    st.tuples(
        st.integers(0, 1),
        st.sampled_from(["prepare", "unprepare"]),
        st.integers(0, len(CLAIM_DEVICES) - 1),
    ),
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(operations=ops)
def test_two_processes_on_one_checkpoint_behave_as_one(
    operations: list[tuple[int, str, int]],
) -> None:
    claims = [make_claim(f"u{i}", d, name=f"c{i}") for i, d in enumerate(CLAIM_DEVICES)]
    source = MemoryClaims(claims)

    async def scenario(root: Path) -> None:
        plugins = (preparer(root, source), preparer(root, source))
        # What one plugin alone would hold: claim index -> its devices.
        model: dict[int, set[int]] = {}
        for which, op, i in operations:
            ref = ref_of(claims[i])
            held = {d for j, devices in model.items() if j != i for d in devices}
            if op == "unprepare":
                await plugins[which].unprepare(ref)
                model.pop(i, None)
            elif held & set(CLAIM_DEVICES[i]):
                with pytest.raises(PrepareError, match="already prepared for ResourceClaim"):
                    await plugins[which].prepare(ref)
            else:
                await plugins[which].prepare(ref)
                model[i] = set(CLAIM_DEVICES[i])
            # On disk after every step: what one plugin alone would have written.
            stored = CheckpointStore(root / "checkpoint.json").load()
            assert set(stored.claims) == {f"u{j}" for j in model}
        restarted = preparer(root, source)
        assert set(restarted.checkpoint.claims) == {f"u{j}" for j in model}
        assert cdi.claim_spec_uids(root / "cdi") == {f"u{j}" for j in model}

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(Path(tmp)))
