"""Every field of our ResourceSlice messages is the API's: same name, number, type, label.

The .proto declares only what the slice publisher writes; this compares each of its fields
with the message of the same name in the pinned Kubernetes sources (Go module cache), so a
typo in a field number cannot turn into a silently different object on the apiserver.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

OURS = Path(__file__).resolve().parents[3] / "protos" / "proto"
FILE = "neuron_dra_protos/kube/resource/v1/resourceslice.proto"
THEIR_PACKAGES = {
    "TypeMeta": "k8s.io.apimachinery.pkg.runtime",
    "Unknown": "k8s.io.apimachinery.pkg.runtime",
    "Quantity": "k8s.io.apimachinery.pkg.api.resource",
    "ObjectMeta": "k8s.io.apimachinery.pkg.apis.meta.v1",
    "OwnerReference": "k8s.io.apimachinery.pkg.apis.meta.v1",
}

Shape = dict[str, tuple[int, int, int, str]]


def _descriptors(root: Path, file: str, out: Path) -> descriptor_pb2.FileDescriptorSet:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"--proto_path={root}",
            "--include_imports",
            f"--descriptor_set_out={out}",
            file,
        ],
        check=True,
        capture_output=True,
    )
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _messages(fds: descriptor_pb2.FileDescriptorSet) -> dict[str, descriptor_pb2.DescriptorProto]:
    """Every message, nested ones (map entries) too, by full name without the leading dot."""
    found: dict[str, descriptor_pb2.DescriptorProto] = {}

    def add(prefix: str, message: descriptor_pb2.DescriptorProto) -> None:
        name = f"{prefix}.{message.name}"
        found[name] = message
        for nested in message.nested_type:
            add(name, nested)

    for file in fds.file:
        for message in file.message_type:
            add(file.package, message)
    return found


def _shape(message: descriptor_pb2.DescriptorProto) -> Shape:
    # A referenced message by its own name: the packages differ on purpose.
    return {
        f.name: (f.number, f.type, f.label, f.type_name.rsplit(".", 1)[-1]) for f in message.field
    }


@pytest.fixture(scope="module")
def upstream(
    tmp_path_factory: pytest.TempPathFactory, kube_module: Callable[[str], Path]
) -> dict[str, descriptor_pb2.DescriptorProto]:
    api, machinery = kube_module("k8s.io/api"), kube_module("k8s.io/apimachinery")
    root = tmp_path_factory.mktemp("k8s-protos")
    (root / "k8s.io").mkdir()
    (root / "k8s.io" / "api").symlink_to(api)
    (root / "k8s.io" / "apimachinery").symlink_to(machinery)
    fds = _descriptors(root, "k8s.io/api/resource/v1/generated.proto", root / "k8s.pb")
    return _messages(fds)


def test_every_field_is_the_apis(
    upstream: dict[str, descriptor_pb2.DescriptorProto], tmp_path: Path
) -> None:
    ours = _messages(_descriptors(OURS, FILE, tmp_path / "ours.pb"))
    prefix = "neuron_dra.kube.resource.v1."
    assert ours, "no messages found"
    for name, message in ours.items():
        short = name.removeprefix(prefix)
        top = short.split(".", 1)[0]
        theirs = upstream[f"{THEIR_PACKAGES.get(top, 'k8s.io.api.resource.v1')}.{short}"]
        want = _shape(theirs)
        for field, shape in _shape(message).items():
            assert field in want, f"{short}.{field} is not a field of the API's {short}"
            assert shape == want[field], f"{short}.{field}: ours {shape}, theirs {want[field]}"


def test_the_publishers_fields_are_all_declared(tmp_path: Path) -> None:
    ours = _messages(_descriptors(OURS, FILE, tmp_path / "ours.pb"))
    device = _shape(ours["neuron_dra.kube.resource.v1.Device"])
    assert set(device) == {"name", "attributes", "capacity", "consumesCounters", "taints"}
    attribute = _shape(ours["neuron_dra.kube.resource.v1.DeviceAttribute"])
    assert set(attribute) == {"int", "bool", "string", "version"}
