"""The audit file: CloudEvents lines, size rotation, ids read back, a cut line removed."""

from __future__ import annotations

import io
import json
from pathlib import Path

from neuron_dra_audit.auditlog import AuditLog, read_tail_ids
from neuron_dra_audit.writer import AuditWriter
from neuron_dra_common.bus import Delivery
from neuron_dra_common.events import DeviceHealthChanged, encode


def line(n: int) -> bytes:
    return json.dumps({"id": f"id-{n}", "pad": "x" * 80}).encode() + b"\n"


def opened(path: Path, **kw: int) -> AuditLog:
    log = AuditLog(
        path,
        max_bytes=kw.get("max_bytes", 1000),
        backups=kw.get("backups", 2),
        fsync=False,
        remember=kw.get("remember", 100),
    )
    log.open()
    return log


def test_rotation_keeps_backups_numbered_newest_first(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = opened(path)
    for n in range(40):
        log.write(f"id-{n}", line(n))
    log.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    assert all(p.stat().st_size <= 1000 for p in tmp_path.iterdir())
    newest = [json.loads(x)["id"] for x in path.read_text().splitlines()]
    older = [json.loads(x)["id"] for x in (tmp_path / "audit.jsonl.1").read_text().splitlines()]
    assert newest[-1] == "id-39"
    assert int(older[-1].split("-")[1]) + 1 == int(newest[0].split("-")[1])


def test_ids_are_read_back_across_the_newest_rotation(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = opened(path)
    for n in range(14):  # 10 fill the first file, 4 start the next
        log.write(f"id-{n}", line(n))
    log.close()
    assert read_tail_ids(path, 6) == [f"id-{n}" for n in range(8, 14)]
    again = opened(path, remember=6)
    again.close()
    assert again.written("id-13")
    assert again.written("id-8")
    assert not again.written("id-7")


def test_a_line_cut_short_by_a_crash_is_removed_at_start(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_bytes(line(1) + line(2)[:30])
    log = opened(path)
    log.close()
    assert log.cut_bytes == 30
    assert path.read_bytes() == line(1)
    assert log.written("id-1")
    assert not log.written("id-2")


async def test_writer_emits_one_cloudevent_and_skips_an_id_already_written(
    tmp_path: Path,
) -> None:
    log = opened(tmp_path / "audit.jsonl", max_bytes=1 << 20)
    out = io.BytesIO()
    writer = AuditWriter(audit_log=log, stdout=out)
    event = DeviceHealthChanged(node="n1", device="neurondevice0", health="Healthy")
    delivery = Delivery(
        subject=event.subject,
        stream="NEURON_AUDIT",
        consumer="audit",
        stream_sequence=7,
        consumer_sequence=7,
        deliveries=1,
        msg_id="abc",
        headers={
            "Nats-Msg-Id": "abc",
            "ce-id": "abc",
            "ce-source": "/x",
            "ce-type": "com.aws.neuron.device.health.v1",
            "ce-specversion": "1.0",
            "ce-time": "2026-03-01T12:00:00.000+00:00",
            "ce-subject": event.ce_subject,
        },
        payload=encode(event),
    )
    await writer.handle(event, delivery)
    await writer.handle(event, delivery)
    log.close()
    [written] = out.getvalue().splitlines()
    ce = json.loads(written)
    assert ce == {
        "specversion": "1.0",
        "id": "abc",
        "source": "/x",
        "type": "com.aws.neuron.device.health.v1",
        "subject": "nodes/n1/devices/neurondevice0",
        "time": "2026-03-01T12:00:00.000+00:00",
        "datacontenttype": "application/json",
        "data": json.loads(encode(event)),
    }
    assert (tmp_path / "audit.jsonl").read_bytes() == written + b"\n"
