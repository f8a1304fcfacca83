"""Checkpoint format: golden files keep loading, checksums, corruption, two phases, conflicts."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from neuron_dra_kubelet_plugin.checkpoint import (
    CHECKPOINT_VERSION,
    Checkpoint,
    CheckpointCorrupted,
    CheckpointStore,
    ClaimEntry,
    ClaimState,
    PreparedDevice,
    UnsupportedCheckpointVersion,
    decode_checkpoint,
    encode_checkpoint,
    read_boot_id,
)

GOLDEN = Path(__file__).parent / "golden"


def entry(
    uid: str,
    devices: tuple[str, ...],
    *,
    state: ClaimState = ClaimState.PREPARE_COMPLETED,
    boot: str = "b1",
) -> ClaimEntry:
    return ClaimEntry(
        uid=uid,
        namespace="default",
        name=f"claim-{uid}",
        state=state,
        boot_id=boot,
        devices=tuple(
            PreparedDevice(request_names=("neurons",), pool="node-a", device=d) for d in devices
        ),
    )


@pytest.mark.parametrize("golden", sorted(GOLDEN.glob("checkpoint_v*.json")), ids=lambda p: p.name)
def test_every_golden_format_still_loads(golden: Path) -> None:
    checkpoint = decode_checkpoint(golden.read_bytes(), source=str(golden))
    claim = checkpoint.claims["2f7b3c1e-0d4e-4b8a-9a51-6c1f0e2d9b11"]
    assert (claim.namespace, claim.name, claim.state) == (
        "default",
        "pod0-neurons-zdk76",
        ClaimState.PREPARE_COMPLETED,
    )
    assert [d.device for d in claim.devices] == [f"neurondevice{i}" for i in range(4)]
    assert [e.uid for e in checkpoint.half_done()] == ["9a0e5d21-3c7f-4f65-b2d8-81e4c7a6f302"]


def test_golden_file_of_the_current_version_exists() -> None:
    assert (GOLDEN / f"checkpoint_v{CHECKPOINT_VERSION}.json").exists()


def test_a_field_added_by_a_later_release_does_not_look_corrupted() -> None:
    raw = json.loads(encode_checkpoint(Checkpoint().with_entry(entry("u1", ("neurondevice0",)))))
    raw["data"]["claims"]["u1"]["podUIDs"] = ["p1"]
    raw["data"]["nodeName"] = "node-a"
    canonical = json.dumps(raw["data"], sort_keys=True, separators=(",", ":")).encode()
    raw["checksum"] = "sha256:" + hashlib.sha256(canonical).hexdigest()
    loaded = decode_checkpoint(json.dumps(raw, indent=4).encode())
    assert loaded.claims["u1"].devices[0].device == "neurondevice0"


def test_round_trip() -> None:
    checkpoint = Checkpoint().with_entry(entry("u1", ("neurondevice0", "neurondevice1")))
    assert decode_checkpoint(encode_checkpoint(checkpoint)) == checkpoint


def test_tampered_content_is_reported_as_corrupted() -> None:
    raw = encode_checkpoint(Checkpoint().with_entry(entry("u1", ("neurondevice0",))))
    tampered = raw.replace(b"neurondevice0", b"neurondevice9")
    with pytest.raises(CheckpointCorrupted, match=r"checkpoint f\.json: checksum does not match"):
        decode_checkpoint(tampered, source="f.json")


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{",
        b"[]",
        b'{"version": 1}',
        b"\x00\x01garbage",
        b'{"version": 1, "checksum": "\xa9"}',
    ],
)
def test_garbage_is_reported_as_corrupted(raw: bytes) -> None:
    with pytest.raises(CheckpointCorrupted):
        decode_checkpoint(raw, source="f.json")


def test_a_newer_format_is_refused_not_misread() -> None:
    data: dict[str, object] = {"claims": {}}
    canonical = msgspec.json.encode(data, order="sorted")
    raw = msgspec.json.encode(
        {
            "version": CHECKPOINT_VERSION + 1,
            "checksum": "sha256:" + hashlib.sha256(canonical).hexdigest(),
            "data": data,
        }
    )
    with pytest.raises(UnsupportedCheckpointVersion, match="newer than"):
        decode_checkpoint(raw)


def test_store_missing_file_is_empty_and_save_is_atomic(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "cp" / "checkpoint.json")
    assert store.load() == Checkpoint()
    checkpoint = Checkpoint().with_entry(entry("u1", ("neurondevice0",)))
    store.save(checkpoint)
    assert store.load() == checkpoint
    assert sorted(p.name for p in store.path.parent.iterdir()) == [
        "checkpoint.json",
        "checkpoint.json.journal",
    ]


def test_corrupted_file_is_quarantined_not_fatal(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json")
    store.path.write_bytes(b'{"version": 1, "checksum": "x", "data": {}}')
    checkpoint, error = store.load_or_quarantine()
    assert checkpoint == Checkpoint()
    assert isinstance(error, CheckpointCorrupted)
    assert (tmp_path / "checkpoint.json.corrupt").exists()
    assert store.load() == Checkpoint()


def test_stale_entries_are_those_of_another_boot() -> None:
    checkpoint = (
        Checkpoint()
        .with_entry(entry("old", ("neurondevice0",), boot="b0"))
        .with_entry(entry("new", ("neurondevice1",), boot="b1"))
    )
    assert [e.uid for e in checkpoint.stale("b1")] == ["old"]


def test_boot_id_is_read(tmp_path: Path) -> None:
    path = tmp_path / "boot_id"
    path.write_text("7d1c2b7e-4f3a\n")
    assert read_boot_id(path) == "7d1c2b7e-4f3a"


_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12)


@given(
    claims=st.dictionaries(
        _names,
        st.tuples(
            st.sampled_from(list(ClaimState)),
            st.lists(st.integers(0, 15), min_size=1, max_size=16, unique=True),
        ),
        max_size=6,
    )
)
def test_the_written_checksum_is_over_the_form_a_reader_recomputes(
    claims: dict[str, tuple[ClaimState, list[int]]],
) -> None:
    checkpoint = Checkpoint()
    for uid, (state, devices) in claims.items():
        checkpoint = checkpoint.with_entry(
            entry(uid, tuple(f"neurondevice{i}" for i in devices), state=state)
        )
    raw = json.loads(encode_checkpoint(checkpoint))
    # What any reader does: the data as plain JSON, keys sorted, no spaces.
    canonical = json.dumps(raw["data"], sort_keys=True, separators=(",", ":")).encode()
    assert raw["checksum"] == "sha256:" + hashlib.sha256(canonical).hexdigest()
    assert decode_checkpoint(json.dumps(raw).encode()) == checkpoint


# --- the journal --------------------------------------------------------------------------


def test_the_golden_journal_applies_to_its_base(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json")
    store.path.write_bytes((GOLDEN / "checkpoint_v2.json").read_bytes())
    store.journal.write_bytes((GOLDEN / "checkpoint_v2.json.journal").read_bytes())
    claims = store.load().claims
    # The journal dropped the half-done claim and put one on neurondevice8.
    assert sorted(claims) == [
        "2f7b3c1e-0d4e-4b8a-9a51-6c1f0e2d9b11",
        "5c1d7e93-2b4a-4f0e-8d61-3a9b0c7e1f24",
    ]
    assert claims["5c1d7e93-2b4a-4f0e-8d61-3a9b0c7e1f24"].devices[0].device == "neurondevice8"


def test_changes_append_to_the_journal_and_load_back(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json")
    one = Checkpoint().with_entry(entry("u1", ("neurondevice0",)))
    store.append(["u0"], one)  # nothing open yet: written as a base
    base = store.path.read_bytes()
    two = one.with_entry(entry("u2", ("neurondevice1",), state=ClaimState.PREPARE_STARTED))
    store.append([two.claims["u2"]], two)
    three = two.without("u1")
    store.append(["u1"], three)
    assert store.path.read_bytes() == base
    assert CheckpointStore(store.path).load() == three
    assert len(store.journal.read_bytes().splitlines()) == 3  # header and two changes


def test_a_line_cut_short_by_a_crash_never_took_effect(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json")
    one = Checkpoint().with_entry(entry("u1", ("neurondevice0",)))
    store.save(one)
    two = one.with_entry(entry("u2", ("neurondevice1",)))
    store.append([two.claims["u2"]], two)
    whole = store.journal.read_bytes()
    store.journal.write_bytes(whole[:-7])  # the write of u2's line stopped part way
    assert CheckpointStore(store.path).load() == one
    store.journal.write_bytes(whole)
    assert CheckpointStore(store.path).load() == two


def test_a_damaged_journal_line_is_corruption_and_both_files_go_aside(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json")
    one = Checkpoint().with_entry(entry("u1", ("neurondevice0",)))
    store.save(one)
    store.append(["u1"], Checkpoint())
    lines = store.journal.read_bytes().splitlines(keepends=True)
    store.journal.write_bytes(lines[0] + lines[1].replace(b'"u1"', b'"u9"'))
    with pytest.raises(CheckpointCorrupted, match=r"journal: line 2: checksum does not match"):
        CheckpointStore(store.path).load()
    checkpoint, error = CheckpointStore(store.path).load_or_quarantine()
    assert checkpoint == Checkpoint()
    assert isinstance(error, CheckpointCorrupted)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint.json.corrupt",
        "checkpoint.json.journal.corrupt",
    ]


def test_a_journal_of_another_base_is_ignored(tmp_path: Path) -> None:
    # A crash after a new base was written and before its journal was started leaves the
    # old journal: the new base already holds what it said.
    store = CheckpointStore(tmp_path / "checkpoint.json")
    store.save(Checkpoint())
    held = Checkpoint().with_entry(entry("u1", ("neurondevice0",)))
    store.append([held.claims["u1"]], held)
    old_journal = store.journal.read_bytes()
    store.save(held)
    store.journal.write_bytes(old_journal)
    assert CheckpointStore(store.path).load() == held
    # A base put back by hand (here: the previous format) is not changed by any journal.
    store.path.write_bytes((GOLDEN / "checkpoint_v1.json").read_bytes())
    assert CheckpointStore(store.path).load() == decode_checkpoint(
        (GOLDEN / "checkpoint_v1.json").read_bytes()
    )


def test_after_a_failed_append_the_next_change_writes_a_new_base(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json")
    store.save(Checkpoint())
    one = Checkpoint().with_entry(entry("u1", ("neurondevice0",)))
    os.close(store._fd)  # type: ignore[arg-type]  # the append below fails (EBADF)
    with pytest.raises(OSError, match="Bad file descriptor"):
        store.append([one.claims["u1"]], one)
    store.append([one.claims["u1"]], one)
    assert decode_checkpoint(store.path.read_bytes()) == one
    assert CheckpointStore(store.path).load() == one
