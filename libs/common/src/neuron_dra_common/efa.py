"""AWS's EFA DRA driver as the Neuron driver meets it: names, and the EFA interfaces of a node.

Amazon EKS's EFA DRA driver (the ``aws-dranet`` chart, built on the upstream DRANET project)
publishes a node's EFA interfaces in ResourceSlices of the driver ``dra.net`` and installs the
DeviceClass ``efa.networking.k8s.aws``, which selects devices whose ``dra.net`` attribute
``pciDevice`` is ``Elastic Fabric Adapter (EFA)`` (EKS user guide, "Manage EFA devices on
Amazon EKS"; the DeviceClass the chart installs). On Neuron instances each interface also carries
``resource.aws.com/devicegroup{1,4,8,16}_id``, computed from the instance's Neuron-to-EFA map
the same way the Neuron driver computes them for its devices, so one claim can ask for Neuron
devices and the EFA interfaces beside them with ``matchAttribute`` (EKS user guide,
"Topology-aware EFA and GPU/Neuron device allocation").

This module knows those names and builds the interfaces of an instance type from the catalog:
one per entry of the EFA map (16 on trn2.48xlarge and trn2u.48xlarge, AWS's published count).
An instance type with EFA whose map AWS does not publish (Trn3, trn1) gets its published number
of interfaces, at the simulator's own PCI addresses and without ``devicegroup`` attributes: a
claim may take them all (AWS's ``efa-claim-template``) but cannot align them with Neuron
devices, as on such an instance on EKS. Instances without EFA get none. The local stack's simulated EFA
driver publishes exactly these; nothing else in the product uses them but the UltraServer
operator's check that the DeviceClass exists. No I/O.
"""

from __future__ import annotations

from typing import Final

import msgspec

from neuron_dra_common.topology import InstanceSpec, devicegroup_id, instance_spec
from neuron_dra_common.topology.attributes import DEVICEGROUP_SIZES, devicegroup_attribute

__all__ = [
    "EFA_CDI_KIND",
    "EFA_DEVICE_CLASS",
    "EFA_DRIVER_NAME",
    "EFA_PCI_DEVICE",
    "EfaInterface",
    "device_class",
    "efa_interfaces",
    "slice_devices",
]

#: The driver name of AWS's EFA DRA driver (DRANET) in ResourceSlices and claim results.
EFA_DRIVER_NAME: Final = "dra.net"
#: The DeviceClass AWS's chart installs, and AWS's UltraServer guide requests.
EFA_DEVICE_CLASS: Final = "efa.networking.k8s.aws"
#: The ``dra.net`` ``pciDevice`` attribute of an EFA interface, which that DeviceClass selects.
EFA_PCI_DEVICE: Final = "Elastic Fabric Adapter (EFA)"
#: The CDI kind of the simulated EFA driver's specs (its own choice; nothing reads it but the
#: container runtime and ``neuron-dra dev env``).
EFA_CDI_KIND: Final = "dra.net/efa"
_PCI_VENDOR: Final = "Amazon.com, Inc."


class EfaInterface(msgspec.Struct, frozen=True, kw_only=True):
    """One EFA interface of a node: its device name in the slice, PCI address, RDMA device
    name, the ``uverbs`` node a container gets, and the Neuron device it is wired to."""

    name: str
    pci_address: str
    rdma_device: str
    uverbs: str
    #: ``None`` where AWS does not publish the instance's Neuron-to-EFA map.
    neuron_device: int | None


def _rdma_name(pci_address: str) -> str:
    # The kernel's name for the RDMA device of a PCI function: bus and slot in decimal.
    _, bus, slot_fn = pci_address.split(":")
    slot = slot_fn.split(".")[0]
    return f"rdmap{int(bus, 16)}s{int(slot, 16)}"


def efa_interfaces(instance: InstanceSpec | str) -> tuple[EfaInterface, ...]:
    """The EFA interfaces of ``instance``: one per distinct address of its EFA map, or its
    published number where AWS publishes no map.

    >>> [i.name for i in efa_interfaces("trn2.48xlarge")][:2]
    ['pci-0000-c9-00-0', 'pci-0000-b4-00-0']
    >>> len(efa_interfaces("trn3.48xlarge")), efa_interfaces("trn3.48xlarge")[0].neuron_device
    (16, None)
    >>> efa_interfaces("inf2.48xlarge")
    ()
    """
    spec = instance if isinstance(instance, InstanceSpec) else instance_spec(instance)
    if spec.efa_map is None:
        # The simulator's own addresses, one PCI bus per interface from 0x10.
        return tuple(
            _interface(f"0000:{0x10 + i:02x}:00.0", index=i, neuron_device=None)
            for i in range(spec.efa_count)
        )
    seen: dict[str, EfaInterface] = {}
    for device, address in enumerate(spec.efa_map):
        if address not in seen:  # two Neuron devices share one interface: published once
            seen[address] = _interface(address, index=len(seen), neuron_device=device)
    return tuple(seen.values())


def _interface(address: str, *, index: int, neuron_device: int | None) -> EfaInterface:
    return EfaInterface(
        name="pci-" + address.replace(":", "-").replace(".", "-"),
        pci_address=address,
        rdma_device=_rdma_name(address),
        uverbs=f"uverbs{index}",
        neuron_device=neuron_device,
    )


def _attributes(spec: InstanceSpec, iface: EfaInterface) -> dict[str, dict[str, object]]:
    attrs: dict[str, dict[str, object]] = {
        "pciAddress": {"string": iface.pci_address},
        "pciDevice": {"string": EFA_PCI_DEVICE},
        "pciVendor": {"string": _PCI_VENDOR},
        "rdma": {"bool": True},
        "rdmaDevice": {"string": iface.rdma_device},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:" + iface.pci_address[5:7]},
    }
    if spec.efa_map is None or iface.neuron_device is None:
        return attrs
    for n in DEVICEGROUP_SIZES:
        value = devicegroup_id(spec.efa_map, device=iface.neuron_device, size=n)
        attrs[devicegroup_attribute(n)] = {"string": value}
    return attrs


def slice_devices(instance: InstanceSpec | str) -> list[dict[str, object]]:
    """The ``spec.devices`` of the node's ``dra.net`` ResourceSlice (``resource.k8s.io/v1``).

    >>> d = slice_devices("trn2.48xlarge")[0]["attributes"]
    >>> d["resource.aws.com/devicegroup1_id"], d["pciDevice"]["string"]
    ({'string': '0000:c9:00.0'}, 'Elastic Fabric Adapter (EFA)')
    """
    spec = instance if isinstance(instance, InstanceSpec) else instance_spec(instance)
    return [
        {"name": iface.name, "attributes": _attributes(spec, iface)}
        for iface in efa_interfaces(spec)
    ]


def device_class() -> dict[str, object]:
    """The DeviceClass AWS's chart installs (``resource.k8s.io/v1``)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": EFA_DEVICE_CLASS},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": f'device.driver == "{EFA_DRIVER_NAME}" && '
                        f'device.attributes["{EFA_DRIVER_NAME}"].pciDevice == '
                        f"'{EFA_PCI_DEVICE}'"
                    }
                }
            ]
        },
    }
