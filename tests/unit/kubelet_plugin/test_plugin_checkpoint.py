"""Checkpoint format: golden files keep loading, checksums, corruption, two phases, conflicts."""

from __future__ import annotations

import hashlib
import json
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


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b'{"version": 1}', b"\x00\x01garbage"])
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
    assert sorted(p.name for p in store.path.parent.iterdir()) == ["checkpoint.json"]


def test_corrupted_file_is_quarantined_not_fatal(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json")
    store.path.write_bytes(b'{"version": 1, "checksum": "x", "data": {}}')
    checkpoint, error = store.load_or_quarantine()
    assert checkpoint == Checkpoint()
    assert isinstance(error, CheckpointCorrupted)
    assert (tmp_path / "checkpoint.json.corrupt").exists()
    assert store.load() == Checkpoint()


def test_conflicts_name_the_holder() -> None:
    checkpoint = Checkpoint().with_entry(entry("u1", ("neurondevice0", "neurondevice1")))
    conflicts = checkpoint.conflicts(
        "u2", [("node-a", "neurondevice1"), ("node-a", "neurondevice2")]
    )
    assert [(c.device, c.holder.uid) for c in conflicts] == [("neurondevice1", "u1")]
    assert checkpoint.conflicts("u1", [("node-a", "neurondevice1")]) == ()


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
