"""The attack matrix's rows for Kubernetes writes: each writer with its own ServiceAccount's
token (the node agents' bound to a pod on their node), against the admission policies in
deploy/kustomize/base/policies."""

from __future__ import annotations

from tests.attacks import Row

_T = "tests/integration/policies/test_node_scoped_writes.py::"

ROWS: tuple[Row, ...] = (
    Row(
        "health probe of node A",
        "write node A's NeuronHealth and AcceleratedHardwareReady conditions",
        "allowed",
        _T + "test_the_health_probe_writes_its_own_nodes_conditions",
    ),
    Row(
        "health probe of each local-stack node (the running process)",
        "write its own Node's NeuronHealth condition with a token naming that node",
        "allowed",
        _T + "test_each_running_health_probe_writes_with_a_token_naming_its_own_node",
    ),
    Row(
        "health probe of node A (its own condition writer)",
        "write node B's NeuronHealth condition through its own writer (node A's is written)",
        "refused",
        _T + "test_the_probes_own_condition_writer_writes_only_its_node",
    ),
    Row(
        "health probe of node A",
        "write node B's conditions",
        "refused",
        _T + "test_the_health_probe_of_a_node_cannot_write_another_nodes_conditions",
    ),
    Row(
        "health probe of node A",
        "write node A's Ready or MemoryPressure condition, a label, its capacity, the Node itself",
        "refused",
        _T + "test_the_health_probe_cannot_write_other_conditions_or_fields",
    ),
    Row(
        "health probe, token bound to no pod",
        "write node A's conditions",
        "refused",
        _T + "test_a_health_probe_token_bound_to_no_pod_names_no_node_and_is_refused",
    ),
    Row(
        "pod on node A in another namespace, ServiceAccount named like the health probe's",
        "write node A's conditions",
        "refused",
        _T + "test_a_pod_in_another_namespace_cannot_write_as_the_health_probe",
    ),
    Row(
        "device plugin of node A",
        "set NEURON_ALLOCATED=true on a pod bound to node A",
        "allowed",
        _T + "test_the_device_plugin_marks_a_pod_on_its_node_served",
    ),
    Row(
        "device plugin of node A",
        "set NEURON_ALLOCATED on a pod bound to node B",
        "refused",
        _T + "test_the_device_plugin_of_a_node_cannot_write_a_pod_on_another_node",
    ),
    Row(
        "device plugin of node A",
        "change another annotation, a label or the spec of a pod on node A, or unset "
        "NEURON_ALLOCATED",
        "refused",
        _T + "test_the_device_plugin_cannot_write_other_annotations_or_fields",
    ),
    Row(
        "failure-detector",
        "add and remove the neuron.aws.com/unstable NoSchedule taint on a Node",
        "allowed",
        _T + "test_the_failure_detector_adds_and_removes_its_taint",
    ),
    Row(
        "failure-detector (its own node notes)",
        "hold a flapping node with its taint and release it",
        "allowed",
        _T + "test_the_failure_detectors_own_notes_hold_and_release_a_node",
    ),
    Row(
        "failure-detector",
        "add another taint, a NoExecute one, set unschedulable, a label or a condition on a Node",
        "refused",
        _T + "test_the_failure_detector_cannot_write_other_node_fields",
    ),
    Row(
        "slice-publisher",
        "create a ResourceSlice of driver neuron.aws.com",
        "allowed",
        _T + "test_the_slice_publisher_writes_neuron_slices",
    ),
    Row(
        "slice-publisher",
        "create, update or delete another driver's ResourceSlice",
        "refused",
        _T + "test_the_slice_publisher_cannot_write_another_drivers_slices",
    ),
)
