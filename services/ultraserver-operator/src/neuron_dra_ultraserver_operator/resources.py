"""The API resources the operator reads and writes."""

from __future__ import annotations

from typing import Final

from neuron_dra_common.kube import Resource
from neuron_dra_common.ultraserver import GROUP

__all__ = [
    "DEVICE_CLASSES",
    "EVENTS",
    "NAMESPACES",
    "NUS",
    "NUSW",
    "PODS",
    "RESOURCE_CLAIM_TEMPLATES",
]

NUSW: Final = Resource(
    group=GROUP,
    version="v1",
    plural="neuronultraserverworkloads",
    kind="NeuronUltraServerWorkload",
    namespaced=True,
)
NUS: Final = Resource(
    group=GROUP,
    version="v1",
    plural="neuronultraservers",
    kind="NeuronUltraServer",
    namespaced=True,
)
RESOURCE_CLAIM_TEMPLATES: Final = Resource(
    group="resource.k8s.io",
    version="v1",
    plural="resourceclaimtemplates",
    kind="ResourceClaimTemplate",
    namespaced=True,
)
PODS: Final = Resource(group="", version="v1", plural="pods", kind="Pod", namespaced=True)
EVENTS: Final = Resource(group="", version="v1", plural="events", kind="Event", namespaced=True)
NAMESPACES: Final = Resource(group="", version="v1", plural="namespaces", kind="Namespace")
#: Read for one name only: whether AWS's EFA driver is installed (``efa``).
DEVICE_CLASSES: Final = Resource(
    group="resource.k8s.io", version="v1", plural="deviceclasses", kind="DeviceClass"
)
