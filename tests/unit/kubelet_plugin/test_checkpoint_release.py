"""A checkpoint written by the previous release is read by this one, and the reverse.

``golden/release_0.1.0/`` holds the base and journal that release 0.1.0 (before the node-wide
lock) wrote for :func:`write_scenario`. This release must read them (the claims they hold stay
prepared and keep their devices), and must write the very same bytes for the same scenario:
the previous release then reads what this one writes, since nothing about the files changed
(same format version, no new field). Regenerate only on purpose, with the release that
should become the reference: ``python -m tests.unit.kubelet_plugin.test_checkpoint_release``.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import pytest
from neuron_dra_common import cdi
from neuron_dra_common.driver import NODE_DEVICE
from neuron_dra_kubelet_plugin.checkpoint import CHECKPOINT_VERSION, CheckpointStore, ClaimState
from neuron_dra_kubelet_plugin.plan import PrepareError
from neuron_dra_kubelet_plugin.preparer import Effects, NodePreparer

from tests.unit.kubelet_plugin.support import MemoryClaims, make_claim, ref_of, trn2u_node

RELEASE = Path(__file__).parent / "golden" / "release_0.1.0"
BOOT = "5b0c9a4e-2f61-4c7d-9e38-1d7a6b2c4f90"
FILES = ("checkpoint.json", "checkpoint.json.journal")

CLAIMS = [
    make_claim("7c1d0e6a-1111-4a2b-8c3d-000000000001", [0, 1, 2, 3], name="train-0-neurons"),
    make_claim("7c1d0e6a-2222-4a2b-8c3d-000000000002", [4], name="infer-0-neurons"),
    make_claim("7c1d0e6a-3333-4a2b-8c3d-000000000003", [8, 9], name="gone-0-neurons"),
]
#: What the release did: the first two claims stay prepared, the third came and went.
OPERATIONS = [("prepare", 0), ("prepare", 2), ("prepare", 1), ("unprepare", 2)]


def start(root: Path, claims: MemoryClaims) -> NodePreparer:
    preparer = NodePreparer(
        node=trn2u_node(),
        claims=claims,
        effects=Effects(store=CheckpointStore(root / "checkpoint.json"), cdi_root=root / "cdi"),
        boot_id=BOOT,
    )
    preparer.recover()
    return preparer


async def write_scenario(root: Path) -> None:
    """Play :data:`OPERATIONS` on a fresh node under ``root``."""
    preparer = start(root, MemoryClaims(CLAIMS))
    for op, i in OPERATIONS:
        if op == "prepare":
            await preparer.prepare(ref_of(CLAIMS[i]))
        else:
            await preparer.unprepare(ref_of(CLAIMS[i]))


def test_this_release_writes_the_bytes_the_previous_one_wrote(tmp_path: Path) -> None:
    asyncio.run(write_scenario(tmp_path))
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (RELEASE / name).read_bytes(), name


async def test_claims_prepared_by_the_previous_release_stay_prepared(tmp_path: Path) -> None:
    for name in FILES:
        (tmp_path / name).write_bytes((RELEASE / name).read_bytes())
    # The specs the release wrote beside its checkpoint (their content is not what is tested).
    for claim in CLAIMS[:2]:
        cdi.write_claim_spec(
            tmp_path / "cdi",
            claim.metadata.uid,
            cdi.Spec(cdi_version=cdi.CDI_VERSION, kind=cdi.NEURON_CDI_KIND, devices=()),
        )
    node_claim = make_claim("7c1d0e6a-4444-4a2b-8c3d-000000000004", [NODE_DEVICE], name="whole")
    preparer = start(tmp_path, MemoryClaims([*CLAIMS, node_claim]))

    assert sorted(preparer.checkpoint.claims) == sorted(c.metadata.uid for c in CLAIMS[:2])
    assert all(e.state is ClaimState.PREPARE_COMPLETED for e in preparer.checkpoint.claims.values())
    assert cdi.claim_spec_uids(tmp_path / "cdi") == set(preparer.checkpoint.claims)
    devices = await preparer.prepare(ref_of(CLAIMS[0]))
    assert [d.device for d in devices] == [f"neurondevice{i}" for i in range(4)]
    with pytest.raises(PrepareError, match="already prepared for ResourceClaim default/"):
        await preparer.prepare(ref_of(node_claim))
    assert CHECKPOINT_VERSION == 2


def _regenerate() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(write_scenario(Path(tmp)))
        RELEASE.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            (RELEASE / name).write_bytes((Path(tmp) / name).read_bytes())
    sys.stdout.write(f"wrote {', '.join(FILES)} under {RELEASE}\n")


if __name__ == "__main__":
    _regenerate()
