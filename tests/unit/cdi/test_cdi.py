"""CDI specs: names, JSON shape, atomic writes, one spec per claim."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from neuron_dra_common import cdi


def spec(uid: str, *devices: str, env: tuple[str, ...] = ()) -> cdi.Spec:
    return cdi.Spec(
        cdi_version=cdi.CDI_VERSION,
        kind=cdi.NEURON_CDI_KIND,
        devices=tuple(
            cdi.Device(
                name=cdi.claim_device_name(uid, d),
                container_edits=cdi.ContainerEdits(
                    device_nodes=(cdi.DeviceNode(path=f"/dev/{d}"),)
                ),
            )
            for d in devices
        ),
        container_edits=cdi.ContainerEdits(env=env),
    )


def test_json_shape_is_cdi_1_1_0(tmp_path: Path) -> None:
    path = cdi.write_claim_spec(
        tmp_path, "u1", spec("u1", "neuron0", env=("NEURON_RT_VISIBLE_CORES=0-3",))
    )
    assert path.name == "neuron.aws.com-neuron_u1.json"
    assert json.loads(path.read_text()) == {
        "cdiVersion": "1.1.0",
        "kind": "neuron.aws.com/neuron",
        "devices": [
            {"name": "u1-neuron0", "containerEdits": {"deviceNodes": [{"path": "/dev/neuron0"}]}}
        ],
        "containerEdits": {"env": ["NEURON_RT_VISIBLE_CORES=0-3"]},
    }


def test_fully_qualified_id() -> None:
    assert cdi.qualified_device_id("u1-neurondevice3") == "neuron.aws.com/neuron=u1-neurondevice3"
    with pytest.raises(cdi.CdiError):
        cdi.qualified_device_id("-bad")
    with pytest.raises(cdi.CdiError, match="not of the form <vendor>/<class>"):
        cdi.qualified_device_id("x", kind="no-class")


def test_names_of_another_claim_are_refused(tmp_path: Path) -> None:
    with pytest.raises(cdi.CdiError, match="does not start with 'u2-'"):
        cdi.write_claim_spec(tmp_path, "u2", spec("u1", "neuron0"))


def test_repeated_device_name_is_refused() -> None:
    with pytest.raises(cdi.CdiError, match=r"devices\[1\]\.name 'u1-neuron0' is repeated"):
        cdi.encode_spec(spec("u1", "neuron0", "neuron0"))


def test_bad_env_is_refused() -> None:
    with pytest.raises(cdi.CdiError, match="is not NAME=value"):
        cdi.encode_spec(spec("u1", "neuron0", env=("JUSTANAME",)))


def test_write_replace_read_remove(tmp_path: Path) -> None:
    root = tmp_path / "cdi"
    cdi.write_claim_spec(root, "u1", spec("u1", "neuron0"))
    cdi.write_claim_spec(root, "u1", spec("u1", "neuron1"))
    cdi.write_claim_spec(root, "u2", spec("u2", "neuron2"))
    read = cdi.read_claim_spec(root, "u1")
    assert read is not None
    assert [d.name for d in read.devices] == ["u1-neuron1"]
    assert cdi.claim_spec_uids(root) == {"u1", "u2"}
    assert sorted(p.name for p in root.iterdir()) == [
        "neuron.aws.com-neuron_u1.json",
        "neuron.aws.com-neuron_u2.json",
    ]
    assert cdi.remove_claim_spec(root, "u1") is True
    assert cdi.remove_claim_spec(root, "u1") is False
    assert cdi.read_claim_spec(root, "u1") is None
    assert cdi.claim_spec_uids(root) == {"u2"}


def test_leftover_temporary_is_removed_with_the_spec(tmp_path: Path) -> None:
    (tmp_path / ".tmp-neuron.aws.com-neuron_u1.json").write_text("{")
    cdi.remove_claim_spec(tmp_path, "u1")
    assert list(tmp_path.iterdir()) == []


def test_decode_reports_bad_files() -> None:
    with pytest.raises(cdi.CdiError, match="CDI spec:"):
        cdi.decode_spec(b'{"cdiVersion": 1}')
