"""The classic path's contract: extended resource names and the scheduler extension's pod
annotations, shared by the scheduler extender (which writes them) and the device plugin (which
reads them). Pure constants.

Resource names are AWS's device plugin's: ``aws.amazon.com/neuron`` (whole devices),
``aws.amazon.com/neurondevice`` (the same, under the name older device plugins used) and
``aws.amazon.com/neuroncore`` (NeuronCores).

The annotations are those AWS's device plugin reads in ``Allocate`` to learn which devices or
cores the scheduler extension chose for a pod: ``AWS_NEURON_IDS`` (comma-separated device
ids, or host-global core ids for ``aws.amazon.com/neuroncore``), ``NEURON_RESOURCE_TYPE``
(which of the two), ``NEURON_ALLOC_TIME`` (Unix nanoseconds), ``NEURON_ALLOCATED`` (``false``
until the device plugin has served it) and ``aws.amazon.com/predicate-node`` (the node chosen).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ANNOTATION_ALLOCATED",
    "ANNOTATION_IDS",
    "ANNOTATION_NODE",
    "ANNOTATION_RESOURCE",
    "ANNOTATION_TIME",
    "CORE_RESOURCE",
    "DEVICE_RESOURCE",
    "DEVICE_RESOURCES",
    "LEGACY_DEVICE_RESOURCE",
    "MANAGED_RESOURCES",
]

DEVICE_RESOURCE: Final = "aws.amazon.com/neuron"
LEGACY_DEVICE_RESOURCE: Final = "aws.amazon.com/neurondevice"
DEVICE_RESOURCES: Final = (DEVICE_RESOURCE, LEGACY_DEVICE_RESOURCE)
CORE_RESOURCE: Final = "aws.amazon.com/neuroncore"
MANAGED_RESOURCES: Final = (*DEVICE_RESOURCES, CORE_RESOURCE)

ANNOTATION_IDS: Final = "AWS_NEURON_IDS"
ANNOTATION_RESOURCE: Final = "NEURON_RESOURCE_TYPE"
ANNOTATION_TIME: Final = "NEURON_ALLOC_TIME"
ANNOTATION_ALLOCATED: Final = "NEURON_ALLOCATED"
ANNOTATION_NODE: Final = "aws.amazon.com/predicate-node"
