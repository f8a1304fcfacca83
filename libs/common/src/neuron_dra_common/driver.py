"""The driver's device contract: the names a ResourceClaim, a DeviceClass and the kubelet see.

A ResourceClaimTemplate written for AWS's Neuron DRA driver works unchanged against this one,
so these names are fixed by AWS's Neuron DRA driver guide:

* the driver (and its DeviceClass, and the domain of its attributes) is ``neuron.aws.com``;
* a node's Neuron devices are ``neurondevice0`` .. ``neurondevice<N-1>``, with the attribute
  ``resourceType: neuron_device``;
* an UltraServer node also has ``neuronnode`` (``resourceType: neuron_node``), the whole node
  as one device: a claim on it holds every Neuron device of the node;
* the CDI specs the kubelet plugin writes are of kind ``neuron.aws.com/neuron``; their
  annotations name the claim, and each device's pool/device, request names and admin access
  (read back by the plugin after a restart and by ``neuron-dra dev env``).
"""

from __future__ import annotations

import functools
import re
from importlib.metadata import PackageNotFoundError, version
from typing import Final

__all__ = [
    "ANNOTATION_ADMIN_ACCESS",
    "ANNOTATION_CLAIM",
    "ANNOTATION_DEVICE",
    "ANNOTATION_REQUESTS",
    "CDI_KIND",
    "DEVICE_RESOURCE_TYPE",
    "DRIVER_NAME",
    "NODE_DEVICE",
    "NODE_RESOURCE_TYPE",
    "TRACEPARENT_ANNOTATION",
    "device_index",
    "device_name",
    "package_version",
]

DRIVER_NAME: Final = "neuron.aws.com"
#: The whole-node device of an UltraServer node; an allocation of it holds every device.
NODE_DEVICE: Final = "neuronnode"
#: ``resourceType`` of a Neuron device and of the whole-node device.
DEVICE_RESOURCE_TYPE: Final = "neuron_device"
NODE_RESOURCE_TYPE: Final = "neuron_node"
#: ``<vendor>/<class>`` of the CDI specs: the driver name is the vendor.
CDI_KIND: Final = f"{DRIVER_NAME}/neuron"
#: CDI spec annotations: ``namespace/name/uid`` of the claim; a device's ``pool/device``; the
#: comma-separated request names a device was allocated for.
ANNOTATION_CLAIM: Final = f"{DRIVER_NAME}/claim"
ANNOTATION_DEVICE: Final = f"{DRIVER_NAME}/device"
ANNOTATION_REQUESTS: Final = f"{DRIVER_NAME}/requests"
#: On a CDI device allocated with ``adminAccess: true``: ``"true"`` (the device is not held).
ANNOTATION_ADMIN_ACCESS: Final = f"{DRIVER_NAME}/admin-access"
#: The annotation that carries a workload's trace into the objects made for it: the
#: UltraServer operator writes the W3C ``traceparent`` of its reconcile span on the
#: ResourceClaimTemplate it generates (so every claim made from it carries it) and on the
#: Node records it writes; the slice publisher and the kubelet plugin start their spans as
#: children of it.
TRACEPARENT_ANNOTATION: Final = f"{DRIVER_NAME}/traceparent"

_DEVICE_PREFIX: Final = "neurondevice"
_DEVICE_RE: Final = re.compile(rf"^{_DEVICE_PREFIX}(0|[1-9][0-9]*)$")


def device_name(index: int) -> str:
    """The published name of Neuron device ``index``.

    >>> device_name(3)
    'neurondevice3'
    """
    return f"{_DEVICE_PREFIX}{index}"


@functools.lru_cache(maxsize=1024)
def device_index(name: str) -> int | None:
    """The index of a ``neurondevice<N>`` name; ``None`` for any other name.

    >>> device_index("neurondevice12"), device_index("neuronnode"), device_index("neurondevice01")
    (12, None, None)
    """
    # Cached: every prepare asks it of every device it names, and a node has few names.
    match = _DEVICE_RE.match(name)
    return int(match.group(1)) if match else None


def package_version(distribution: str = "neuron-dra-common") -> str:
    """The installed version of a neuron-dra package (by default the driver's shared library).

    Published as ``draDriverVersion`` and printed by ``--version``; ``0.0.0`` when running from
    a source tree without package metadata.
    """
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "0.0.0"
