"""Neuron device topology: the instance catalog, links, connected sets and their attributes.

Pure functions over immutable values; nothing here does I/O.
"""

from neuron_dra_common.topology.adjacency import adjacency, is_linked_graph, neighbours
from neuron_dra_common.topology.attributes import (
    attribute_groups,
    device_attributes,
    devicegroup_id,
    group_attribute_names,
    node_attributes,
)
from neuron_dra_common.topology.catalog import (
    CATALOG,
    InstanceSpec,
    LinkTopology,
    UnknownInstanceType,
    catalog_instance_types,
    instance_spec,
    logical_cores_per_device,
)
from neuron_dra_common.topology.connected import (
    InvalidDeviceCount,
    check_request,
    connected_sets,
    free_connected_sets,
    is_connected_set,
    valid_counts,
)
from neuron_dra_common.topology.cores import device_cores, format_ranges, visible_cores

__all__ = [
    "CATALOG",
    "InstanceSpec",
    "InvalidDeviceCount",
    "LinkTopology",
    "UnknownInstanceType",
    "adjacency",
    "attribute_groups",
    "catalog_instance_types",
    "check_request",
    "connected_sets",
    "device_attributes",
    "device_cores",
    "devicegroup_id",
    "format_ranges",
    "free_connected_sets",
    "group_attribute_names",
    "instance_spec",
    "is_connected_set",
    "is_linked_graph",
    "logical_cores_per_device",
    "neighbours",
    "node_attributes",
    "valid_counts",
    "visible_cores",
]
