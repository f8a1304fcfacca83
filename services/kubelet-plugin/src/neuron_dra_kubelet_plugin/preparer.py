"""Prepare and unprepare claims crash-safely: checkpoint, CDI spec, checkpoint.

Every side effect goes through :class:`Effects`, in an order that a crash at any point can
undo or finish:

prepare
  1. save the entry as ``PrepareStarted``
  2. write the CDI spec
  3. save the entry as ``PrepareCompleted``
unprepare
  1. remove the CDI spec
  2. drop the entry

:meth:`NodePreparer.recover`, run before serving, rolls back half-done prepares, drops
entries from before the last reboot and removes CDI specs no entry accounts for. A prepare
repeated for a completed claim answers from the checkpoint; for a half-done one it rolls
back and starts over.

Every prepare and unprepare, and the recovery, runs under the node lock
(:mod:`~neuron_dra_kubelet_plugin.nodelock`), because two plugin processes serve a node
during a rolling update: under it the preparer first takes in what the other process wrote
(:meth:`NodePreparer._refresh`), then plans and writes, all without awaiting anything, so the
lock is held for a few file writes.

Claims are prepared concurrently (the kubelet prepares many pods at once): one claim at a
time per UID, its devices reserved in the in-memory checkpoint before anything is written.
File work runs on the event loop: a spec is a few kilobytes written and renamed without a
flush, and a checkpoint change is one line appended to its journal (microseconds), less than
a hand-off to a thread costs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import msgspec
from neuron_dra_common import cdi
from opentelemetry import trace

from neuron_dra_kubelet_plugin import claimtrace
from neuron_dra_kubelet_plugin.checkpoint import (
    Change,
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    ClaimEntry,
    ClaimState,
    PreparedDevice,
)
from neuron_dra_kubelet_plugin.claims import ClaimRef, ResourceClaim
from neuron_dra_kubelet_plugin.edits import UltraServerPlacement
from neuron_dra_kubelet_plugin.faults import CrashPoint, no_crash
from neuron_dra_kubelet_plugin.nodelock import NodeLock, NodeLockTimeout, lock_path_for
from neuron_dra_kubelet_plugin.plan import NodeContext, PrepareError, entry_from_spec, plan_prepare

__all__ = [
    "ClaimSource",
    "Effects",
    "FailureReporter",
    "NodePreparer",
    "PrepareListener",
    "Preparer",
    "Recovery",
]

log = logging.getLogger(__name__)


class Preparer(Protocol):
    """What the DRA servicer delegates to, one claim at a time.

    Both methods raise :class:`~neuron_dra_kubelet_plugin.plan.PrepareError` with a message
    for that claim; both are idempotent.
    """

    async def prepare(self, ref: ClaimRef) -> tuple[PreparedDevice, ...]: ...

    async def unprepare(self, ref: ClaimRef) -> None: ...


class ClaimSource(Protocol):
    """Where claim objects come from (informer cache, falling back to a GET)."""

    async def get(self, ref: ClaimRef) -> ResourceClaim | None:
        """The claim ``ref`` names, or ``None`` when it does not exist."""
        ...


class PrepareListener(Protocol):
    """Told about every change of a claim's state on the node, after it is on disk.

    ``prepared`` and ``unprepared`` are the transitions. A process can die between the
    change on disk and telling it (or before what it told left the process); the kubelet then
    asks again, and the answer comes from the disk. So a repeated prepare answered from the
    checkpoint is told again (``told_prepared``), and so is an unprepare of a claim with no
    entry (``told_unprepared``): the kubelet unprepares only claims it saw prepared on this
    node. What is told again is the same event under the same id, which the bus and the
    audit drop when it was already told.
    """

    def prepared(self, entry: ClaimEntry) -> None: ...

    def unprepared(self, entry: ClaimEntry) -> None: ...

    def told_prepared(self, entry: ClaimEntry) -> None: ...

    def told_unprepared(self, ref: ClaimRef) -> None: ...


class FailureReporter(Protocol):
    """Told when a claim cannot be prepared, with the message the kubelet gets."""

    def failed(self, claim: ResourceClaim, message: str) -> None: ...


class Effects:
    """The file system side of prepare: one checkpoint file and the claims' CDI specs."""

    def __init__(
        self,
        *,
        store: CheckpointStore,
        cdi_root: Path,
        kind: str = cdi.NEURON_CDI_KIND,
        lock: NodeLock | None = None,
    ):
        self.store = store
        self.cdi_root = cdi_root
        self.kind = kind
        self.lock = lock or NodeLock(lock_path_for(store.path))

    def load(self) -> tuple[Checkpoint, CheckpointError | None]:
        self.store.remove_leftovers()
        return self.store.load_or_quarantine()

    def is_current(self) -> bool:
        """Whether the checkpoint on disk is what this process last wrote."""
        return self.store.is_current()

    def reload(self) -> tuple[Checkpoint, CheckpointError | None]:
        """The checkpoint as another process left it (unreadable files set aside)."""
        return self.store.load_or_quarantine()

    def save(self, checkpoint: Checkpoint) -> None:
        self.store.save(checkpoint)

    def append(self, changes: list[Change], current: Checkpoint) -> None:
        self.store.append(changes, current)

    def write_spec(self, uid: str, spec: cdi.Spec) -> None:
        cdi.write_claim_spec(self.cdi_root, uid, spec)

    def remove_spec(self, uid: str) -> None:
        cdi.remove_claim_spec(self.cdi_root, uid, self.kind)

    def read_spec(self, uid: str) -> cdi.Spec | None:
        return cdi.read_claim_spec(self.cdi_root, uid, self.kind)

    def has_spec(self, uid: str) -> bool:
        return cdi.has_claim_spec(self.cdi_root, uid, self.kind)

    def spec_uids(self) -> set[str]:
        return cdi.claim_spec_uids(self.cdi_root, self.kind)


class Recovery(msgspec.Struct, frozen=True, kw_only=True):
    """What :meth:`NodePreparer.recover` found and undid."""

    rolled_back: tuple[str, ...] = ()
    stale: tuple[str, ...] = ()
    orphan_specs: tuple[str, ...] = ()
    checkpoint_error: str | None = None


def _no_placement(ref: ClaimRef) -> UltraServerPlacement | None:
    return None


class _Held:
    """``async with`` one claim's lock; the lock is forgotten when nobody holds or waits."""

    __slots__ = ("_entry", "_locks", "_uid")

    def __init__(self, locks: dict[str, tuple[asyncio.Lock, list[int]]], uid: str) -> None:
        self._locks = locks
        self._uid = uid
        entry = locks.get(uid)
        if entry is None:
            entry = locks[uid] = (asyncio.Lock(), [0])
        entry[1][0] += 1
        self._entry = entry

    async def __aenter__(self) -> None:
        try:
            await self._entry[0].acquire()
        except BaseException:
            self._release_user()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._entry[0].release()
        self._release_user()

    def _release_user(self) -> None:
        users = self._entry[1]
        users[0] -= 1
        if users[0] == 0:
            del self._locks[self._uid]


class _ClaimLocks:
    """One lock per claim UID, kept only while someone holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    def hold(self, uid: str) -> _Held:
        return _Held(self._locks, uid)


class NodePreparer:
    """The plugin's :class:`Preparer`: plans with :func:`plan_prepare`, applies with ``effects``."""

    def __init__(
        self,
        *,
        node: NodeContext,
        claims: ClaimSource,
        effects: Effects,
        boot_id: str,
        placement: Callable[[ClaimRef], UltraServerPlacement | None] = _no_placement,
        listener: PrepareListener | None = None,
        reporter: FailureReporter | None = None,
        crash: CrashPoint = no_crash,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self._node = node
        self._claims = claims
        self._effects = effects
        self._boot_id = boot_id
        self._placement = placement
        self._listener = listener
        self._reporter = reporter
        self._crash = crash
        # A tracer handed in always records; else the process's, once tracing is on.
        self._tracer = tracer
        self._checkpoint = Checkpoint()
        # One operation per claim at a time; the kubelet sends claims concurrently.
        self._claim_locks = _ClaimLocks()
        # Changes made in memory and not yet on disk (a failed append leaves them here).
        self._pending: list[Change] = []

    @property
    def checkpoint(self) -> Checkpoint:
        return self._checkpoint

    def recover(self) -> Recovery:
        """Load the checkpoint and bring disk and checkpoint back to a consistent state.

        Under the node lock: a plugin process still serving beside this one is never caught
        between two steps, so what looks half done here was left by a process that died.
        """
        with self._effects.lock.held_now():
            return self._recover()

    def _recover(self) -> Recovery:
        checkpoint, error = self._effects.load()
        self._checkpoint = checkpoint
        if error is not None:
            log.error("%s; rebuilding it from the CDI specs on disk", error)
            self._rebuild_from_specs()
        stale = {e.uid for e in self._checkpoint.stale(self._boot_id)}
        half = {e.uid for e in self._checkpoint.half_done()} - stale
        # A completed entry whose spec is gone is an unprepare that stopped between its two
        # steps: finishing it is the only safe direction (the kubelet retries either call).
        half |= {uid for uid in self._checkpoint.claims if not self._effects.has_spec(uid)} - stale
        for uid in sorted(stale | half):
            self._rollback(uid)
        orphans = self._effects.spec_uids() - set(self._checkpoint.claims)
        for uid in sorted(orphans):
            self._effects.remove_spec(uid)
        return Recovery(
            rolled_back=tuple(sorted(half)),
            stale=tuple(sorted(stale)),
            orphan_specs=tuple(sorted(orphans)),
            checkpoint_error=str(error) if error else None,
        )

    def _rebuild_from_specs(self) -> None:
        # The specs are the side effect that outlives the checkpoint, and they name their
        # claim and devices: enough to keep refusing devices that are still in use.
        checkpoint = Checkpoint()
        for uid in sorted(self._effects.spec_uids()):
            try:
                spec = self._effects.read_spec(uid)
            except cdi.CdiError as exc:
                log.warning("CDI spec of claim %s is unreadable (%s); removing it", uid, exc)
                continue
            entry = entry_from_spec(spec, boot_id=self._boot_id) if spec else None
            if entry is not None and entry.uid == uid:
                checkpoint = checkpoint.with_entry(entry)
        self._effects.save(checkpoint)
        self._checkpoint = checkpoint

    def _refresh(self) -> None:
        """Under the node lock: take in what another plugin process wrote since this one did.

        Changes of this process not yet on disk (a write that failed) are applied again on
        top: they are still owed to the disk, and the next commit writes them.
        """
        if self._effects.is_current():
            return
        checkpoint, error = self._effects.reload()
        if error is not None:
            log.error("%s; rebuilding it from the CDI specs on disk", error)
            self._rebuild_from_specs()
            checkpoint = self._checkpoint
        for change in self._pending:
            checkpoint = (
                checkpoint.without(change)
                if isinstance(change, str)
                else checkpoint.with_entry(change)
            )
        self._checkpoint = checkpoint

    def _rollback(self, uid: str) -> None:
        self._effects.remove_spec(uid)
        updated = self._checkpoint.without(uid)
        self._effects.save(updated)
        self._checkpoint = updated

    def _change(self, checkpoint: Checkpoint, change: Change) -> None:
        """Make ``checkpoint`` (``change`` applied) current in memory; :meth:`_commit` writes it."""
        self._checkpoint = checkpoint
        self._pending.append(change)

    def _commit(self) -> None:
        """Put every change made so far on disk (raises if it cannot; they stay pending)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        try:
            self._effects.append(pending, self._checkpoint)
        except BaseException:
            self._pending = pending + self._pending
            raise

    def _rollback_now(self, uid: str) -> None:
        self._effects.remove_spec(uid)
        self._change(self._checkpoint.without(uid), uid)
        self._commit()

    def _completed(self, ref: ClaimRef) -> ClaimEntry | None:
        entry = self._checkpoint.claims.get(ref.uid)
        if (
            entry is not None
            and entry.state is ClaimState.PREPARE_COMPLETED
            and entry.boot_id == self._boot_id
            and self._effects.has_spec(ref.uid)
        ):
            return entry
        return None

    async def prepare(self, ref: ClaimRef) -> tuple[PreparedDevice, ...]:
        done = self._completed(ref)
        if done is not None:
            return self._again(done)
        claim = await self._claims.get(ref)
        if claim is None:
            raise PrepareError(f"{ref}: not found")
        self._crash("prepare:claim-read")
        async with self._claim_locks.hold(ref.uid):
            try:
                async with self._effects.lock.held():
                    return self._prepare_locked(ref, claim)
            except NodeLockTimeout as exc:
                raise PrepareError(f"{ref}: {exc}") from None

    def _prepare_locked(self, ref: ClaimRef, claim: ResourceClaim) -> tuple[PreparedDevice, ...]:
        # Nothing here awaits: the node lock is held for file writes only.
        self._refresh()
        done = self._completed(ref)
        if done is not None:
            return self._again(done)
        with claimtrace.prepare_span(claim, tracer=self._tracer):
            if ref.uid in self._checkpoint.claims:
                self._rollback_now(ref.uid)
            try:
                plan = plan_prepare(
                    ref=ref,
                    claim=claim,
                    node=self._node,
                    checkpoint=self._checkpoint,
                    boot_id=self._boot_id,
                    placement=self._placement(ref),
                )
            except PrepareError as exc:
                if self._reporter is not None:
                    self._reporter.failed(claim, str(exc))
                raise
            # Planned and reserved with no await in between: a concurrent prepare of another
            # claim sees these devices as taken from here on.
            started = msgspec.structs.replace(plan.entry, state=ClaimState.PREPARE_STARTED)
            self._change(self._checkpoint.with_entry(started), started)
            self._commit()
            self._crash("prepare:started-saved")
            with claimtrace.cdi_write_span(ref.uid, tracer=self._tracer):
                self._effects.write_spec(ref.uid, plan.spec)
            self._crash("prepare:spec-written")
            self._change(self._checkpoint.with_entry(plan.entry), plan.entry)
            self._commit()
            self._crash("prepare:completed-saved")
            if self._listener is not None:
                self._listener.prepared(plan.entry)
            return plan.entry.devices

    def _again(self, done: ClaimEntry) -> tuple[PreparedDevice, ...]:
        """A prepare answered from the checkpoint: told again (see :class:`PrepareListener`)."""
        if self._listener is not None:
            self._listener.told_prepared(done)
        return done.devices

    async def unprepare(self, ref: ClaimRef) -> None:
        # Needs nothing but the UID: the claim object may be gone already.
        async with self._claim_locks.hold(ref.uid):
            try:
                async with self._effects.lock.held():
                    self._unprepare_locked(ref)
            except NodeLockTimeout as exc:
                raise PrepareError(f"{ref}: {exc}") from None

    def _unprepare_locked(self, ref: ClaimRef) -> None:
        self._refresh()
        self._crash("unprepare:begin")
        self._effects.remove_spec(ref.uid)
        self._crash("unprepare:spec-removed")
        entry = self._checkpoint.claims.get(ref.uid)
        if entry is not None:
            self._change(self._checkpoint.without(ref.uid), ref.uid)
        # Also when there was nothing to drop: an earlier write that failed may still owe
        # the disk this claim's removal.
        self._commit()
        if entry is not None:
            self._crash("unprepare:entry-dropped")
            if self._listener is not None and entry.state is ClaimState.PREPARE_COMPLETED:
                self._listener.unprepared(entry)
        elif self._listener is not None:
            self._listener.told_unprepared(ref)
