"""The generated gRPC code is current, and the wire contract matches the kubelet's."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor
from neuron_dra_protos.dra.v1 import dra_pb2 as v1
from neuron_dra_protos.dra.v1beta1 import dra_pb2 as v1beta1
from neuron_dra_protos.health.v1alpha1 import health_pb2
from neuron_dra_protos.registration.v1 import registration_pb2

from protos.generate import check


def test_generated_code_is_not_stale() -> None:
    stale = check()
    assert stale == [], f"run `uv run python -m protos.generate`; stale: {stale}"


def fields(message: Descriptor) -> dict[str, int]:
    return {f.name: f.number for f in message.fields}


def test_dra_v1_field_numbers() -> None:
    assert fields(v1.NodePrepareResourcesRequest.DESCRIPTOR) == {"claims": 1}
    assert fields(v1.NodePrepareResourcesResponse.DESCRIPTOR) == {"claims": 1}
    assert fields(v1.NodePrepareResourceResponse.DESCRIPTOR) == {"devices": 1, "error": 2}
    assert fields(v1.Device.DESCRIPTOR) == {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
        "share_id": 5,
    }
    assert fields(v1.NodeUnprepareResourceResponse.DESCRIPTOR) == {"error": 1}
    assert fields(v1.Claim.DESCRIPTOR) == {"namespace": 1, "uid": 2, "name": 3}
    assert v1.Device.DESCRIPTOR.fields_by_name["share_id"].has_presence


def test_dra_v1beta1_has_no_share_id() -> None:
    assert "share_id" not in fields(v1beta1.Device.DESCRIPTOR)
    assert fields(v1beta1.Claim.DESCRIPTOR) == {"namespace": 1, "uid": 2, "name": 3}


def test_method_paths_are_the_kubelets() -> None:
    assert v1.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == (
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    )
    assert v1beta1.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == (
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
    )
    health = health_pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"]
    assert health.full_name == "v1alpha1.DRAResourceHealth"
    assert health.methods_by_name["NodeWatchResources"].server_streaming
    registration = registration_pb2.DESCRIPTOR.services_by_name["Registration"]
    assert registration.full_name == "pluginregistration.Registration"
    assert set(registration.methods_by_name) == {"GetInfo", "NotifyRegistrationStatus"}


def test_health_and_registration_field_numbers() -> None:
    assert fields(health_pb2.DeviceHealth.DESCRIPTOR) == {
        "device": 1,
        "health": 2,
        "last_updated_time": 3,
        "health_check_timeout_seconds": 4,
        "message": 5,
    }
    assert fields(health_pb2.DeviceIdentifier.DESCRIPTOR) == {"pool_name": 1, "device_name": 2}
    assert dict(health_pb2.HealthStatus.items()) == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
    assert fields(registration_pb2.PluginInfo.DESCRIPTOR) == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    assert fields(registration_pb2.RegistrationStatus.DESCRIPTOR) == {
        "plugin_registered": 1,
        "error": 2,
    }


def _descriptor_set(proto_root: Path, file: Path, out: Path) -> descriptor_pb2.FileDescriptorSet:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"--proto_path={proto_root}",
            f"--descriptor_set_out={out}",
            str(file.relative_to(proto_root)),
        ],
        check=True,
        capture_output=True,
    )
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _shape(fds: descriptor_pb2.FileDescriptorSet) -> dict[str, object]:
    (file,) = fds.file
    messages = {
        m.name: sorted((f.name, f.number, f.type, f.label, f.type_name) for f in m.field)
        for m in file.message_type
    }
    # Map entry types are nested messages; compare them too.
    for m in file.message_type:
        for nested in m.nested_type:
            messages[f"{m.name}.{nested.name}"] = sorted(
                (f.name, f.number, f.type, f.label, f.type_name) for f in nested.field
            )
    services = {
        s.name: sorted((m.name, m.input_type, m.output_type, m.server_streaming) for m in s.method)
        for s in file.service
    }
    enums = {e.name: sorted((v.name, v.number) for v in e.value) for e in file.enum_type}
    return {"package": file.package, "messages": messages, "services": services, "enums": enums}


OURS = Path(__file__).resolve().parents[3] / "protos" / "proto"


@pytest.mark.parametrize(
    ("theirs", "ours"),
    [
        ("dra/v1/api.proto", "neuron_dra_protos/dra/v1/dra.proto"),
        ("dra/v1beta1/api.proto", "neuron_dra_protos/dra/v1beta1/dra.proto"),
        ("dra-health/v1alpha1/api.proto", "neuron_dra_protos/health/v1alpha1/health.proto"),
        ("pluginregistration/v1/api.proto", "neuron_dra_protos/registration/v1/registration.proto"),
    ],
)
def test_wire_shape_equals_the_pinned_kubelets(
    theirs: str, ours: str, tmp_path: Path, kube_module: Callable[[str], Path]
) -> None:
    apis = kube_module("k8s.io/kubelet") / "pkg" / "apis"
    kubelet = _shape(_descriptor_set(apis, apis / theirs, tmp_path / "k.pb"))
    mine = _shape(_descriptor_set(OURS, OURS / ours, tmp_path / "o.pb"))
    assert mine == kubelet
