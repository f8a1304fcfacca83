"""What a pod asks for and what a node has, read from their API objects. Pure.

Resource names are AWS's device plugin's (:mod:`neuron_dra_common.extended`, shared with our
device plugin): ``aws.amazon.com/neuron`` (whole devices), ``aws.amazon.com/neurondevice`` (the
same, under the name older device plugins used) and ``aws.amazon.com/neuroncore`` (NeuronCores).
"""

from __future__ import annotations

import math

import msgspec
from neuron_dra_common.extended import (
    CORE_RESOURCE,
    DEVICE_RESOURCE,
    DEVICE_RESOURCES,
    MANAGED_RESOURCES,
)
from neuron_dra_common.topology import (
    InstanceSpec,
    UnknownInstanceType,
    instance_spec,
    logical_cores_per_device,
)

from neuron_dra_scheduler_extender.api import Container, NodeView, PodView

__all__ = [
    "CORE_RESOURCE",
    "DEVICE_RESOURCE",
    "DEVICE_RESOURCES",
    "INSTANCE_TYPE_LABELS",
    "MANAGED_RESOURCES",
    "Ask",
    "AskError",
    "NodeShape",
    "ask_of",
    "shape_of",
]


#: Where a node says its instance type (the second is the pre-1.17 name).
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")


class AskError(ValueError):
    """A pod's Neuron request cannot be read; the message names the pod and the field."""


class Ask(msgspec.Struct, frozen=True, kw_only=True):
    """``count`` devices, or ``count`` NeuronCores when ``cores``, for the whole pod."""

    resource: str
    count: int

    @property
    def cores(self) -> bool:
        return self.resource == CORE_RESOURCE


class NodeShape(msgspec.Struct, frozen=True, kw_only=True):
    """A Neuron node: ``instance_type`` as its label spells it (the refusal text quotes it),
    its catalog entry, and its logical NeuronCores per device."""

    name: str
    instance_type: str
    spec: InstanceSpec
    cores_per_device: int

    @property
    def devices(self) -> int:
        return self.spec.devices

    @property
    def total_cores(self) -> int:
        return self.spec.devices * self.cores_per_device

    def device_cores(self, device: int) -> range:
        """The host-global logical core ids of ``device``."""
        return range(device * self.cores_per_device, (device + 1) * self.cores_per_device)

    def device_of(self, core: int) -> int:
        return core // self.cores_per_device

    def devices_needed(self, cores: int) -> int:
        return math.ceil(cores / self.cores_per_device)


def _quantity(value: str | int | float, *, where: str) -> int:
    if isinstance(value, bool):
        raise AskError(f"{where}: {value!r} is not a whole number")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise AskError(f"{where}: {value!r} is not a whole number")
    text = value.strip()
    if text.isdigit():
        return int(text)
    raise AskError(f"{where}: {value!r} is not a whole number")


def _container_amount(pod: PodView, container: Container, resource: str, *, field: str) -> int:
    res = container.resources
    # Extended resources must have equal requests and limits; limits alone is the usual form.
    value = res.limits.get(resource, res.requests.get(resource))
    if value is None:
        return 0
    where = f"Pod {pod.key}: {field}[{container.name}].resources.limits[{resource}]"
    return _quantity(value, where=where)


def _pod_amount(pod: PodView, resource: str) -> int:
    # As the scheduler counts a pod: its containers together, or its largest init container.
    running = sum(
        _container_amount(pod, c, resource, field="spec.containers") for c in pod.spec.containers
    )
    init = max(
        (
            _container_amount(pod, c, resource, field="spec.initContainers")
            for c in pod.spec.init_containers
        ),
        default=0,
    )
    return max(running, init)


def ask_of(pod: PodView) -> Ask | None:
    """The pod's Neuron request, or None when it asks for none.

    Raises :class:`AskError` for a request that is not a whole number, or one that asks for
    devices and cores at once (one set of devices serves the pod; it cannot be both).
    """
    amounts = {r: _pod_amount(pod, r) for r in MANAGED_RESOURCES}
    asked = [r for r, n in amounts.items() if n > 0]
    if not asked:
        return None
    if len(asked) > 1:
        raise AskError(
            f"Pod {pod.key}: asks for {' and '.join(asked)}; ask for devices or NeuronCores, "
            "not both"
        )
    resource = asked[0]
    return Ask(resource=resource, count=amounts[resource])


def _capacity(node: NodeView, resource: str) -> int:
    value = node.status.capacity.get(resource)
    if value is None:
        return 0
    try:
        return _quantity(value, where=f"Node {node.metadata.name}: status.capacity[{resource}]")
    except AskError:
        return 0


def shape_of(node: NodeView) -> NodeShape:
    """The node's Neuron shape from its instance-type label and capacity.

    Logical cores per device come from the node's capacity when it reports both devices and
    cores (a trn2 node at LNC=1 has 8, not the default 4); else from the catalog. Raises
    :class:`~neuron_dra_common.topology.UnknownInstanceType` (a ``LookupError``) for a node
    whose instance type is missing or not a Neuron one.
    """
    labels = node.metadata.labels
    instance_type = next((labels[k] for k in INSTANCE_TYPE_LABELS if labels.get(k)), "")
    if not instance_type:
        raise UnknownInstanceType("")
    spec = instance_spec(instance_type)
    devices = max(_capacity(node, r) for r in DEVICE_RESOURCES)
    cores = _capacity(node, CORE_RESOURCE)
    if devices == spec.devices and cores and cores % devices == 0:
        per_device = cores // devices
    else:
        per_device = logical_cores_per_device(spec)
    return NodeShape(
        name=node.metadata.name,
        instance_type=instance_type,
        spec=spec,
        cores_per_device=per_device,
    )
