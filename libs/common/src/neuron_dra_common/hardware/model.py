"""What discovery reads from a node, as immutable values.

These Structs travel inside the NodeInventory event, so they follow the event evolution rules:
a field added later always has a default, and a field's type never changes. A value that could
not be read is ``None`` (and the reason is listed in :attr:`NodeHardware.problems`), never a
made-up number.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "NODE_ID_NOT_MEMBER",
    "ArchInfo",
    "CoreStatus",
    "Counter",
    "EccCounters",
    "HardwareProblem",
    "NeuronDevice",
    "NodeHardware",
    "UltraServerInfo",
]

#: What the driver writes to ``node_id_2`` / ``node_id_4`` when the node is not part of an
#: UltraServer of that size.
NODE_ID_NOT_MEMBER = -1


class Counter(msgspec.Struct, frozen=True, kw_only=True):
    """A driver statistic: ``total`` since the driver loaded, ``present`` in the current window."""

    total: int
    present: int


class EccCounters(msgspec.Struct, frozen=True, kw_only=True):
    """The device's ECC counters (``stats/hardware/...``); ``None`` where unreadable."""

    sram_uncorrected: Counter | None = None
    mem_uncorrected: Counter | None = None
    mem_repairable_uncorrected: Counter | None = None


class CoreStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Status counters of one physical NeuronCore (``neuron_coreY/stats/status/<name>``)."""

    index: int
    counters: dict[str, Counter] = msgspec.field(default_factory=dict)


class ArchInfo(msgspec.Struct, frozen=True, kw_only=True):
    """``info/architecture/*``: e.g. ``NDv3`` / ``Trn2`` / ``Trainium2``."""

    arch_type: str | None = None
    instance_type: str | None = None
    device_name: str | None = None


class NeuronDevice(msgspec.Struct, frozen=True, kw_only=True):
    """One Neuron device (``/dev/neuronN``) as the node reports it.

    ``physical_cores`` comes from sysfs ``core_count``; ``logical_cores`` is the count at the
    node's LNC as ``neuron-ls`` reports it (``nc_count``). ``connected_devices`` keeps the
    driver's order (for a torus: up, left, down, right).
    """

    index: int
    physical_cores: int | None = None
    logical_cores: int | None = None
    memory_bytes: int | None = None
    connected_devices: tuple[int, ...] = ()
    serial_number: str | None = None
    arch: ArchInfo | None = None
    bdf: str | None = None
    numa_node: int | None = None
    cpu_affinity: str | None = None
    ecc: EccCounters = msgspec.field(default_factory=EccCounters)
    cores: tuple[CoreStatus, ...] = ()


class UltraServerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Class-level UltraServer files of the driver.

    Trn2 UltraServers publish ``server_id_2``/``server_id_4`` (16 hex characters) and
    ``node_id_2``/``node_id_4``: ``-1`` (:data:`NODE_ID_NOT_MEMBER`) when the node is not part
    of one of that size. While the driver runs its election the node ids read ``busy`` and the
    server ids all zeros; then ``election_busy`` is true and the affected ids are ``None``.
    Trn3 publishes ``reservation_id`` and ``node_id`` instead. ``supported_modes`` are the
    driver's ``ultraserver_mode`` enums (1 = 4-node, 2 = 2-node horizontal, 3 = 2-node
    vertical, 4 = single node); fewer modes than usual means broken links.
    """

    server_id_2: str | None = None
    server_id_4: str | None = None
    node_id_2: int | None = None
    node_id_4: int | None = None
    election_busy: bool = False
    supported_modes: tuple[int, ...] = ()
    reservation_id: str | None = None
    node_id: int | None = None


class HardwareProblem(msgspec.Struct, frozen=True, kw_only=True):
    """Something discovery could not read, with where and why.

    ``device`` is set when the problem concerns one device; ``fatal`` when that device could
    not be described at all (it is then missing from :attr:`NodeHardware.devices`).
    """

    path: str
    reason: str
    device: int | None = None
    fatal: bool = False


class NodeHardware(msgspec.Struct, frozen=True, kw_only=True):
    """Everything discovery read from one node.

    ``default_lnc`` is the node's logical NeuronCore config as the node reports it (its LNC
    file, else what ``neuron-ls`` shows); ``None`` where the instance has no LNC or the node
    says nothing, and the catalog default applies.
    """

    instance_type: str
    driver_version: str | None = None
    default_lnc: int | None = None
    devices: tuple[NeuronDevice, ...] = ()
    ultraserver: UltraServerInfo | None = None
    problems: tuple[HardwareProblem, ...] = ()
