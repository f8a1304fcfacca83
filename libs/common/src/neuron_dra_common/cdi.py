"""Container Device Interface (CDI) 1.1.0: the spec model and an atomic spec writer.

The kubelet plugin writes one spec file per prepared claim and hands the container runtime
the fully qualified ids of its devices (``neuron.aws.com/neuron=<claim-uid>-neurondevice3``).
Every device name starts with the claim UID: the runtime loads all spec files of a kind
together and refuses a name defined twice, and a claim's devices must never be confused
with those of an earlier claim that got the same hardware.

Layout under the CDI root (``/var/run/cdi`` by default, configurable)::

    neuron.aws.com-neuron_<claim-uid>.json

Writes go to a temporary file in the same directory, and are renamed over the
target, so a reader (or a crash) sees either the old spec or the new one, never a part.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from pathlib import Path

import msgspec

from neuron_dra_common.driver import CDI_KIND
from neuron_dra_common.files import replace_file

__all__ = [
    "CDI_VERSION",
    "DEFAULT_CDI_ROOT",
    "NEURON_CDI_KIND",
    "CdiError",
    "ContainerEdits",
    "Device",
    "DeviceNode",
    "Hook",
    "Mount",
    "Spec",
    "claim_device_name",
    "claim_spec_path",
    "claim_spec_uids",
    "decode_spec",
    "encode_spec",
    "has_claim_spec",
    "qualified_device_id",
    "read_claim_spec",
    "remove_claim_spec",
    "validate_spec",
    "write_claim_spec",
]

CDI_VERSION = "1.1.0"
DEFAULT_CDI_ROOT = Path("/var/run/cdi")
#: ``<vendor>/<class>`` of every spec the plugin writes.
NEURON_CDI_KIND = CDI_KIND

# CDI's own rules: the vendor is a domain-like name, the class a simple name, and a device
# name starts and ends with an alphanumeric and may hold '-', '_', '.' and ':' between.
_VENDOR_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
_CLASS_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_-]*[A-Za-z0-9])?$")
_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._:-]*[A-Za-z0-9])?$")
_SPEC_SUFFIX = ".json"
_TEMP_PREFIX = ".tmp-"


class CdiError(ValueError):
    """A CDI spec or one of its names is not valid; the message names the field."""


class DeviceNode(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    """A device node to create in the container (``path``), from ``host_path`` on the host."""

    path: str
    host_path: str | None = None
    type: str | None = None
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None
    permissions: str | None = None
    uid: int | None = None
    gid: int | None = None


class Mount(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    """A bind (or other) mount into the container."""

    host_path: str
    container_path: str
    type: str | None = None
    options: tuple[str, ...] = ()


class Hook(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    """An OCI hook to run at ``hook_name`` (e.g. ``createContainer``)."""

    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None


class ContainerEdits(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    """What the runtime changes in a container: ``env`` holds ``NAME=value`` strings."""

    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()
    additional_gids: tuple[int, ...] = ()


class Device(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    """One named device of a spec with the edits injecting it brings."""

    name: str
    container_edits: ContainerEdits
    annotations: dict[str, str] = msgspec.field(default_factory=dict)


class Spec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    """A CDI spec file.

    ``container_edits`` at spec level apply once whenever any device of the spec is
    injected; the plugin puts the claim-wide Neuron runtime variables there.
    """

    cdi_version: str
    kind: str
    devices: tuple[Device, ...]
    container_edits: ContainerEdits = msgspec.field(default_factory=ContainerEdits)
    annotations: dict[str, str] = msgspec.field(default_factory=dict)


@functools.lru_cache(maxsize=64)
def _split_kind(kind: str) -> tuple[str, str]:
    # Checked for every device of every spec, and a plugin has one kind: checked once.
    vendor, sep, class_ = kind.partition("/")
    if not sep or not _VENDOR_RE.match(vendor) or not _CLASS_RE.match(class_):
        raise CdiError(f"CDI kind {kind!r} is not of the form <vendor>/<class>")
    return vendor, class_


def claim_device_name(claim_uid: str, device: str) -> str:
    """The CDI device name of ``device`` prepared for claim ``claim_uid``.

    >>> claim_device_name("6f1c-4a", "neurondevice3")
    '6f1c-4a-neurondevice3'
    """
    name = f"{claim_uid}-{device}"
    if not _NAME_RE.match(name):
        raise CdiError(f"CDI device name {name!r} (claim {claim_uid}, device {device}) is invalid")
    return name


def qualified_device_id(name: str, kind: str = NEURON_CDI_KIND) -> str:
    """The fully qualified CDI device id ``<vendor>/<class>=<name>``.

    >>> qualified_device_id("u1-neurondevice0")
    'neuron.aws.com/neuron=u1-neurondevice0'
    """
    _split_kind(kind)
    if not _NAME_RE.match(name):
        raise CdiError(f"CDI device name {name!r} is invalid")
    return f"{kind}={name}"


def validate_spec(spec: Spec) -> None:
    """Raise :class:`CdiError` naming the field when ``spec`` breaks a CDI rule."""
    if spec.cdi_version != CDI_VERSION:
        raise CdiError(f"CDI spec: cdiVersion {spec.cdi_version!r} is not {CDI_VERSION!r}")
    _split_kind(spec.kind)
    seen: set[str] = set()
    for i, device in enumerate(spec.devices):
        if not _NAME_RE.match(device.name):
            raise CdiError(f"CDI spec {spec.kind}: devices[{i}].name {device.name!r} is invalid")
        if device.name in seen:
            raise CdiError(f"CDI spec {spec.kind}: devices[{i}].name {device.name!r} is repeated")
        seen.add(device.name)
        for j, node in enumerate(device.container_edits.device_nodes):
            if not node.path.startswith("/"):
                raise CdiError(
                    f"CDI spec {spec.kind}: devices[{i}].containerEdits.deviceNodes[{j}].path "
                    f"{node.path!r} is not absolute"
                )
    for edits in (spec.container_edits, *(d.container_edits for d in spec.devices)):
        for entry in edits.env:
            if "=" not in entry:
                raise CdiError(f"CDI spec {spec.kind}: env entry {entry!r} is not NAME=value")


_ENCODER = msgspec.json.Encoder()


def encode_spec(spec: Spec) -> bytes:
    """The JSON bytes of ``spec`` (validated first)."""
    validate_spec(spec)
    return _ENCODER.encode(spec)


def decode_spec(data: bytes) -> Spec:
    """Parse a JSON spec; unknown fields are kept out, wrong types raise :class:`CdiError`."""
    try:
        return msgspec.json.decode(data, type=Spec)
    except msgspec.DecodeError as exc:
        raise CdiError(f"CDI spec: {exc}") from exc


@functools.lru_cache(maxsize=4096)
def _spec_name(claim_uid: str, kind: str) -> str:
    vendor, class_ = _split_kind(kind)
    if not claim_uid or not _NAME_RE.match(claim_uid):
        raise CdiError(f"claim UID {claim_uid!r} cannot name a CDI spec file")
    return f"{vendor}-{class_}_{claim_uid}{_SPEC_SUFFIX}"


def _spec_paths(cdi_root: str | os.PathLike[str], claim_uid: str, kind: str) -> tuple[str, str]:
    # Plain strings: these run on every prepare and unprepare, where pathlib's object
    # churn costs more than the file work itself.
    name = _spec_name(claim_uid, kind)
    root = os.fspath(cdi_root)
    return os.path.join(root, name), os.path.join(root, _TEMP_PREFIX + name)


def claim_spec_path(cdi_root: Path, claim_uid: str, kind: str = NEURON_CDI_KIND) -> Path:
    """Where the spec of claim ``claim_uid`` lives: ``<root>/<vendor>-<class>_<uid>.json``."""
    return cdi_root / _spec_name(claim_uid, kind)


def has_claim_spec(cdi_root: Path, claim_uid: str, kind: str = NEURON_CDI_KIND) -> bool:
    """Whether claim ``claim_uid`` has a spec under ``cdi_root``."""
    return os.path.exists(_spec_paths(cdi_root, claim_uid, kind)[0])


def write_claim_spec(cdi_root: Path, claim_uid: str, spec: Spec) -> Path:
    """Atomically write the spec of ``claim_uid`` under ``cdi_root``; returns its path.

    Every device name must belong to the claim (start with ``<claim_uid>-``): that is what
    keeps names from being reused across claims.
    """
    prefix = f"{claim_uid}-"
    for i, device in enumerate(spec.devices):
        if not device.name.startswith(prefix):
            raise CdiError(
                f"CDI spec for claim {claim_uid}: devices[{i}].name {device.name!r} does not "
                f"start with {prefix!r}"
            )
    data = encode_spec(spec)
    target, temp = _spec_paths(cdi_root, claim_uid, spec.kind)
    # Runtimes only load *.json/*.yaml, so the temporary name is never read half-written.
    # The rename makes the write atomic for every reader and across a crash of the writer.
    # No fsync: a spec only means something within the boot that wrote it (CDI roots are
    # tmpfs on real nodes, and the kubelet prepares again after a reboot), so making it
    # survive a power loss would cost a disk flush per claim and buy nothing.
    replace_file(target, temp, data)
    return Path(target)


def read_claim_spec(cdi_root: Path, claim_uid: str, kind: str = NEURON_CDI_KIND) -> Spec | None:
    """The spec of ``claim_uid``, or ``None`` when there is none."""
    try:
        data = claim_spec_path(cdi_root, claim_uid, kind).read_bytes()
    except FileNotFoundError:
        return None
    return decode_spec(data)


def remove_claim_spec(cdi_root: Path, claim_uid: str, kind: str = NEURON_CDI_KIND) -> bool:
    """Remove the spec of ``claim_uid`` (and a leftover temporary); ``True`` if one existed."""
    target, temp = _spec_paths(cdi_root, claim_uid, kind)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temp)
    try:
        os.unlink(target)
    except FileNotFoundError:
        return False
    return True


def claim_spec_uids(cdi_root: Path, kind: str = NEURON_CDI_KIND) -> set[str]:
    """The claim UIDs that have a spec of ``kind`` under ``cdi_root`` (to find leftovers)."""
    vendor, class_ = _split_kind(kind)
    prefix = f"{vendor}-{class_}_"
    if not cdi_root.is_dir():
        return set()
    return {
        path.name[len(prefix) : -len(_SPEC_SUFFIX)]
        for path in cdi_root.iterdir()
        if path.name.startswith(prefix) and path.name.endswith(_SPEC_SUFFIX)
    }
