"""The CRD manifests in deploy/ are what the renderer produces, and say what users rely on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from neuron_dra_ultraserver_operator.crds import render, ultraserver_crd, workload_crd

CRD_DIR = Path(__file__).resolve().parents[3] / "deploy" / "kustomize" / "base" / "crds"


def test_committed_manifests_are_current() -> None:
    for name, text in render().items():
        path = CRD_DIR / name
        assert path.exists(), f"{path} missing: python -m neuron_dra_ultraserver_operator.crds"
        assert path.read_text() == text, (
            f"{path} is stale: run python -m neuron_dra_ultraserver_operator.crds {CRD_DIR}"
        )


def _version(crd: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in crd["spec"]["versions"] if v["name"] == name)


def test_served_as_v1beta1_storage_and_v1_with_one_schema() -> None:
    for crd in (workload_crd(), ultraserver_crd()):
        beta, v1 = _version(crd, "v1beta1"), _version(crd, "v1")
        assert beta["served"]
        assert beta["storage"]
        assert v1["served"]
        assert not v1["storage"]
        assert beta["schema"] == v1["schema"]
        assert beta["subresources"] == {"status": {}}
        assert crd["spec"]["scope"] == "Namespaced"
        assert crd["spec"]["group"] == "neuron.aws.com"


def test_short_names_and_printer_columns() -> None:
    nusw, nus = workload_crd(), ultraserver_crd()
    assert nusw["spec"]["names"]["shortNames"] == ["nusw"]
    assert nus["spec"]["names"]["shortNames"] == ["nus"]
    columns = [c["name"] for c in _version(nusw, "v1")["additionalPrinterColumns"]]
    assert columns[:4] == ["State", "Size", "Servers", "Nodes"]
    assert columns[-1] == "Age"
    nus_columns = [c["name"] for c in _version(nus, "v1")["additionalPrinterColumns"]]
    assert {"State", "Nodes", "Allocated", "Age"} <= set(nus_columns)


def test_workload_validation_rules() -> None:
    spec = _version(workload_crd(), "v1")["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["required"] == ["instanceType", "topologySize", "serverCount"]
    props = spec["properties"]
    assert props["instanceType"]["x-kubernetes-validations"][0]["rule"] == "self == oldSelf"
    assert props["topologySize"]["x-kubernetes-validations"][0]["rule"] == "self in [1, 2, 4]"
    assert props["serverCount"]["x-kubernetes-validations"][0]["rule"] == "self >= 1"
    strategy = props["allocationPolicy"]["properties"]["failureStrategy"]
    assert strategy["enum"] == ["NoOp", "RestartAll", "ReplaceAffected", "MigrateAffected"]
    assert strategy["default"] == "NoOp"
    lnc = props["config"]["properties"]["logicalNeuronCore"]
    assert lnc["enum"] == [1, 2]
    assert lnc["default"] == 2


def test_states_are_the_guide_table_not_bound() -> None:
    status = _version(workload_crd(), "v1")["schema"]["openAPIV3Schema"]["properties"]["status"]
    states = status["properties"]["state"]["enum"]
    assert states == [
        "Pending",
        "Allocating",
        "Allocated",
        "PartiallyAllocated",
        "Failed",
        "Deallocating",
    ]
    assert "Bound" not in states


def test_manifests_are_plain_yaml_without_anchors() -> None:
    for name, text in render().items():
        assert "&id" not in text, name
        assert yaml.safe_load(text)
