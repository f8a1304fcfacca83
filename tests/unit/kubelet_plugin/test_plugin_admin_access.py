"""Claims allocated with ``adminAccess: true`` (a monitoring pod's): prepared beside the
claims that hold the same devices, never holding them, against a real directory."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from neuron_dra_common import cdi
from neuron_dra_kubelet_plugin.checkpoint import Checkpoint, CheckpointStore, encode_checkpoint
from neuron_dra_kubelet_plugin.claims import ResourceClaim, claim_from_api
from neuron_dra_kubelet_plugin.plan import PrepareError, plan_prepare
from neuron_dra_kubelet_plugin.preparer import Effects, NodePreparer

from tests.unit.kubelet_plugin.support import MemoryClaims, claim_json, ref_of, trn2_node


def admin_claim(uid: str, devices: list[int], *, normal: tuple[int, ...] = ()) -> ResourceClaim:
    """A claim allocated ``devices`` with admin access (and ``normal`` without it)."""
    raw: dict[str, Any] = claim_json(uid, [*devices, *normal], name=f"monitor-{uid}")
    for result in raw["status"]["allocation"]["devices"]["results"][: len(devices)]:
        result["adminAccess"] = True
    return claim_from_api(raw)


def normal_claim(uid: str, devices: list[int]) -> ResourceClaim:
    return claim_from_api(claim_json(uid, devices, name=f"job-{uid}"))


ALL = list(range(16))
JOB = normal_claim("job", [0, 1, 2, 3])
MONITOR = admin_claim("mon", ALL)


def preparer(root: Path, *claims: ResourceClaim) -> NodePreparer:
    p = NodePreparer(
        node=trn2_node(),
        claims=MemoryClaims(claims),
        effects=Effects(store=CheckpointStore(root / "checkpoint.json"), cdi_root=root / "cdi"),
        boot_id="b1",
    )
    p.recover()
    return p


def prepare(p: NodePreparer, claim: ResourceClaim) -> None:
    asyncio.run(p.prepare(ref_of(claim)))


def device_nodes(root: Path, uid: str) -> list[str]:
    spec = cdi.read_claim_spec(root / "cdi", uid)
    assert spec is not None, uid
    paths = [n.path for d in spec.devices for n in d.container_edits.device_nodes]
    return sorted(paths, key=lambda path: int(path.removeprefix("/dev/neuron")))


def test_the_monitor_gets_every_device_beside_a_busy_one(tmp_path: Path) -> None:
    later = normal_claim("later", [4, 5])
    clash = normal_claim("clash", [3])
    p = preparer(tmp_path, JOB, MONITOR, later, clash)
    prepare(p, JOB)
    prepare(p, MONITOR)
    assert device_nodes(tmp_path, "mon") == [f"/dev/neuron{i}" for i in ALL]
    entry = CheckpointStore(tmp_path / "checkpoint.json").load().claims["mon"]
    assert all(d.admin_access for d in entry.devices)
    # A normal claim still gets a free device the monitor sees...
    prepare(p, later)
    # ...and a device the job holds is still refused, naming the job, not the monitor.
    with pytest.raises(PrepareError, match=r"already prepared for ResourceClaim default/job-job"):
        prepare(p, clash)


def test_the_monitor_first_then_the_job(tmp_path: Path) -> None:
    p = preparer(tmp_path, JOB, MONITOR)
    prepare(p, MONITOR)
    prepare(p, JOB)
    assert set(p.checkpoint.claims) == {"mon", "job"}


def test_unpreparing_the_monitor_leaves_the_job_alone(tmp_path: Path) -> None:
    p = preparer(tmp_path, JOB, MONITOR)
    prepare(p, JOB)
    prepare(p, MONITOR)
    asyncio.run(p.unprepare(ref_of(MONITOR)))
    assert device_nodes(tmp_path, "job") == [f"/dev/neuron{i}" for i in range(4)]
    # After a restart the job still holds its devices.
    clash = normal_claim("clash", [2])
    again = preparer(tmp_path, JOB, MONITOR, clash)
    assert set(again.checkpoint.claims) == {"job"}
    with pytest.raises(PrepareError, match="already prepared for ResourceClaim default/job-job"):
        prepare(again, clash)


def test_a_lost_checkpoint_is_rebuilt_with_admin_access(tmp_path: Path) -> None:
    p = preparer(tmp_path, MONITOR)
    prepare(p, MONITOR)
    (tmp_path / "checkpoint.json").write_text("not json")
    later = normal_claim("later", [7])
    rebuilt = preparer(tmp_path, MONITOR, later)
    assert all(d.admin_access for d in rebuilt.checkpoint.claims["mon"].devices)
    prepare(rebuilt, later)


def test_a_device_also_asked_for_without_admin_access_is_held() -> None:
    # Request "neurons" got 0 with admin access and 0 again without it: the claim holds 0.
    mixed = admin_claim("mixed", [0], normal=(0,))
    plan = plan_prepare(
        ref=ref_of(mixed), claim=mixed, node=trn2_node(), checkpoint=Checkpoint(), boot_id="b1"
    )
    assert [d.admin_access for d in plan.entry.devices] == [False]
    with pytest.raises(PrepareError, match="already prepared for ResourceClaim default/monitor-"):
        plan_prepare(
            ref=ref_of(JOB),
            claim=JOB,
            node=trn2_node(),
            checkpoint=Checkpoint().with_entry(plan.entry),
            boot_id="b1",
        )


def test_an_ordinary_entry_is_written_as_before() -> None:
    plan = plan_prepare(
        ref=ref_of(JOB), claim=JOB, node=trn2_node(), checkpoint=Checkpoint(), boot_id="b1"
    )
    raw = encode_checkpoint(Checkpoint().with_entry(plan.entry))
    assert b"adminAccess" not in raw
