"""The instance catalog: what each Trainium/Inferentia instance type has.

One :class:`InstanceSpec` per instance type, looked up by name with :func:`instance_spec`.
Figures are AWS's published ones. Where AWS does not publish a value (the EFA map of every
instance but trn2/trn2u, the PCI device id of Trn3, the architecture names outside Trn2) the
field says so: ``efa_map`` is ``None`` and no ``resource.aws.com/devicegroup*`` attribute is
published, ``pci_device_id`` is ``None``, and the architecture names are the simulator's.
"""

from __future__ import annotations

import enum

import msgspec

__all__ = [
    "CATALOG",
    "GIB",
    "PCI_VENDOR_ID",
    "TRN2_EFA_MAP",
    "InstanceSpec",
    "LinkTopology",
    "UnknownInstanceType",
    "catalog_instance_types",
    "instance_spec",
    "logical_cores_per_device",
]

GIB = 1024**3

#: PCI vendor id of every Neuron device (Annapurna Labs).
PCI_VENDOR_ID = "1d0f"

#: Neuron device index -> the PCI address of the EFA device wired to it, on trn2 and trn2u.
TRN2_EFA_MAP: tuple[str, ...] = (
    "0000:c9:00.0",  # neuron0
    "0000:b4:00.0",  # neuron1
    "0000:b3:00.0",  # neuron2
    "0000:ca:00.0",  # neuron3
    "0000:6c:00.0",  # neuron4
    "0000:57:00.0",  # neuron5
    "0000:56:00.0",  # neuron6
    "0000:6d:00.0",  # neuron7
    "0000:98:00.0",  # neuron8
    "0000:83:00.0",  # neuron9
    "0000:82:00.0",  # neuron10
    "0000:99:00.0",  # neuron11
    "0000:f5:00.0",  # neuron12
    "0000:e0:00.0",  # neuron13
    "0000:df:00.0",  # neuron14
    "0000:f6:00.0",  # neuron15
)


class LinkTopology(enum.StrEnum):
    """How the devices of one node are wired to each other."""

    TORUS4X4 = "torus4x4"
    """4x4 2D torus; device ``i`` at row ``i // 4``, column ``i % 4``, links wrap around."""
    RING = "ring"
    """Devices ``0..N-1`` in a cycle (``N-1`` links back to ``0``)."""
    LINE = "line"
    """Devices ``0..N-1`` in a chain without the link back."""
    ALL_TO_ALL = "all-to-all"
    """Every device reaches every other one (through a switch)."""
    NONE = "none"
    """A single device: nothing to link."""


class InstanceSpec(msgspec.Struct, frozen=True, kw_only=True):
    """The Neuron hardware of one instance type.

    ``default_lnc`` is ``None`` on instances without logical NeuronCore configuration (inf1,
    inf2, trn1); there a device's logical core count is its physical one.
    ``ultraserver_nodes`` is the number of nodes of one UltraServer (1 for a plain instance).
    ``efa_count`` is the number of EFA devices of the node; ``efa_map`` (device index -> EFA PCI
    address) only where AWS publishes it.
    """

    name: str
    family: str
    devices: int
    physical_cores_per_device: int
    memory_bytes_per_device: int
    topology: LinkTopology
    pci_device_id: str | None
    arch_type: str
    arch_instance_type: str
    device_name: str
    efa_count: int = 0
    efa_map: tuple[str, ...] | None = None
    default_lnc: int | None = None
    supported_lnc: tuple[int, ...] = ()
    ultraserver_nodes: int = 1
    aliases: tuple[str, ...] = ()


class UnknownInstanceType(LookupError):
    """The instance type is not in the catalog."""

    def __init__(self, name: str) -> None:
        self.name = name
        known = ", ".join(catalog_instance_types())
        super().__init__(f"instance type {name!r} is not a Neuron instance type (known: {known})")


def _inf1(size: str, devices: int) -> InstanceSpec:
    # Physically a chain; AWS's scheduler extension treats it as a ring, and so do we so that
    # the extender path answers as AWS's does.
    return InstanceSpec(
        name=f"inf1.{size}",
        family="inf1",
        devices=devices,
        physical_cores_per_device=4,
        memory_bytes_per_device=8 * GIB,
        topology=LinkTopology.RING if devices > 1 else LinkTopology.NONE,
        pci_device_id="7064",
        arch_type="NDv1",
        arch_instance_type="Inf1",
        device_name="Inferentia",
    )


def _inf2(size: str, devices: int, topology: LinkTopology) -> InstanceSpec:
    return InstanceSpec(
        name=f"inf2.{size}",
        family="inf2",
        devices=devices,
        physical_cores_per_device=2,
        memory_bytes_per_device=32 * GIB,
        topology=topology,
        pci_device_id="7264",
        arch_type="NDv2",
        arch_instance_type="Inf2",
        device_name="Inferentia2",
    )


def _trn1(name: str, *, devices: int, efa_count: int) -> InstanceSpec:
    return InstanceSpec(
        name=name,
        family=name.split(".")[0],
        devices=devices,
        physical_cores_per_device=2,
        memory_bytes_per_device=32 * GIB,
        topology=LinkTopology.TORUS4X4 if devices == 16 else LinkTopology.NONE,
        pci_device_id="7164",
        arch_type="NDv2",
        arch_instance_type="Trn1",
        device_name="Trainium",
        efa_count=efa_count,
    )


def _trn2(name: str, *, ultraserver_nodes: int) -> InstanceSpec:
    return InstanceSpec(
        name=name,
        family=name.split(".")[0],
        devices=16,
        physical_cores_per_device=8,
        memory_bytes_per_device=96 * GIB,
        topology=LinkTopology.TORUS4X4,
        pci_device_id="7364",
        arch_type="NDv3",
        arch_instance_type="Trn2",
        device_name="Trainium2",
        efa_count=16,
        efa_map=TRN2_EFA_MAP,
        default_lnc=2,
        supported_lnc=(1, 2),
        ultraserver_nodes=ultraserver_nodes,
    )


_TRN3 = InstanceSpec(
    name="trn3.48xlarge",
    family="trn3",
    devices=16,
    physical_cores_per_device=8,
    memory_bytes_per_device=144 * GIB,
    topology=LinkTopology.ALL_TO_ALL,
    pci_device_id=None,  # not published
    arch_type="NDv4",
    arch_instance_type="Trn3",
    device_name="Trainium3",
    efa_count=16,
    default_lnc=2,
    supported_lnc=(1, 2),
    ultraserver_nodes=4,
    # The UltraServer gen1 shows up under more than one name.
    aliases=("trn3pds", "trn3pds.48xlarge", "trn3u.48xlarge"),
)

CATALOG: tuple[InstanceSpec, ...] = (
    _inf1("xlarge", 1),
    _inf1("2xlarge", 1),
    _inf1("6xlarge", 4),
    _inf1("24xlarge", 16),
    _inf2("xlarge", 1, LinkTopology.NONE),
    _inf2("8xlarge", 1, LinkTopology.NONE),
    _inf2("24xlarge", 6, LinkTopology.LINE),
    _inf2("48xlarge", 12, LinkTopology.RING),
    _trn1("trn1.2xlarge", devices=1, efa_count=1),
    _trn1("trn1.32xlarge", devices=16, efa_count=8),
    _trn1("trn1n.32xlarge", devices=16, efa_count=16),
    _trn2("trn2.48xlarge", ultraserver_nodes=1),
    _trn2("trn2u.48xlarge", ultraserver_nodes=4),
    _TRN3,
)

_BY_NAME: dict[str, InstanceSpec] = {
    key.lower(): spec for spec in CATALOG for key in (spec.name, *spec.aliases)
}


def catalog_instance_types() -> tuple[str, ...]:
    """The canonical names of every instance type in the catalog, in catalog order."""
    return tuple(spec.name for spec in CATALOG)


def instance_spec(name: str) -> InstanceSpec:
    """Look up an instance type by name, case-insensitively, aliases included.

    >>> instance_spec("Trn3pds").name
    'trn3.48xlarge'

    Raises :class:`UnknownInstanceType` for anything else.
    """
    spec = _BY_NAME.get(name.strip().lower())
    if spec is None:
        raise UnknownInstanceType(name)
    return spec


def logical_cores_per_device(spec: InstanceSpec, lnc: int | None = None) -> int:
    """Logical NeuronCores per device at ``lnc`` (the instance default when ``None``).

    >>> logical_cores_per_device(instance_spec("trn2.48xlarge"))
    4
    >>> logical_cores_per_device(instance_spec("trn2.48xlarge"), 1)
    8
    """
    if spec.default_lnc is None:
        if lnc not in (None, 1):
            raise ValueError(
                f"instance type {spec.name}: logical NeuronCore config {lnc} is not supported "
                "(this instance has no LNC setting)"
            )
        return spec.physical_cores_per_device
    effective = spec.default_lnc if lnc is None else lnc
    if effective not in spec.supported_lnc:
        allowed = ", ".join(str(v) for v in spec.supported_lnc)
        raise ValueError(
            f"instance type {spec.name}: logical NeuronCore config {effective} is not one of "
            f"{allowed}"
        )
    return spec.physical_cores_per_device // effective
