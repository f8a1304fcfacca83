"""The scheduler extender's rows: who may call its verbs, and which pods it binds."""

from __future__ import annotations

from tests.attacks import Row

_MTLS = "tests/integration/extender/test_extender_mtls.py"
_SCHEDULING = "tests/integration/extender/test_extender_scheduling.py"
_SCHEDULER = "kube-scheduler (the extender's client certificate)"

ROWS: tuple[Row, ...] = (
    Row(
        "anonymous (no client certificate)",
        "call the extender's /bind",
        "refused",
        f"{_MTLS}::test_a_client_without_a_certificate_is_refused_at_the_handshake",
    ),
    Row(
        "node (its kubelet certificate, from the cluster CA)",
        "call the extender's /bind",
        "refused",
        f"{_MTLS}::test_a_certificate_from_another_ca_is_refused_at_the_handshake",
    ),
    Row(
        "anonymous (a TLS handshake never finished)",
        "hold the verbs port's connections open",
        "refused",
        f"{_MTLS}::test_a_client_that_never_finishes_the_handshake_is_cut_off",
    ),
    Row(
        "anonymous (plain HTTP to the verbs port)",
        "call the extender's /bind",
        "refused",
        f"{_MTLS}::test_plain_http_to_the_verbs_port_gets_no_answer",
    ),
    Row(
        "anonymous (the probes and metrics port)",
        "call the extender's /bind",
        "refused",
        f"{_MTLS}::test_the_probes_port_serves_no_verb",
    ),
    Row(
        _SCHEDULER,
        "open a TLS connection to the extender's verbs",
        "allowed",
        f"{_MTLS}::test_the_schedulers_certificate_passes_the_same_handshake",
    ),
    Row(
        _SCHEDULER,
        "bind a pod that asks for no Neuron resource to a node",
        "refused",
        f"{_MTLS}::test_the_schedulers_certificate_cannot_bind_a_pod_that_asks_for_no_neuron_resource",
    ),
    Row(
        _SCHEDULER,
        "bind a pod that asks for no Neuron resource after a filter call claiming it does",
        "refused",
        f"{_MTLS}::test_a_filter_body_claiming_neuron_devices_does_not_make_a_plain_pod_bindable",
    ),
    Row(
        _SCHEDULER,
        "place a pod asking for 0 Neuron devices through the extender (the reason in its event)",
        "refused",
        f"{_MTLS}::test_a_pod_asking_for_zero_neuron_devices_reads_why_in_its_failed_scheduling_event",
    ),
    Row(
        _SCHEDULER + ", my-scheduler",
        "place and bind a Neuron pod on connected devices",
        "allowed",
        f"{_SCHEDULING}::test_three_devices_on_inf2_are_a_ring_window_through_my_scheduler",
    ),
    Row(
        _SCHEDULER + ", the default scheduler",
        "place and bind a Neuron pod on connected devices",
        "allowed",
        f"{_SCHEDULING}::test_four_devices_on_trn2_are_one_row_through_the_default_scheduler",
    ),
)
