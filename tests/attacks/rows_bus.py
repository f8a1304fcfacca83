"""The bus's rows of the attack matrix: real nats-server with the component's auth.conf, the
real auth callout and the real apiserver's tokens."""

from __future__ import annotations

from tests.attacks import Row

_T = "tests/integration/busauth/test_attacks.py"
_C = "tests/integration/busauth/test_callout.py"
_A = "tests/integration/busauth/test_alive_attacks.py"

ROWS: tuple[Row, ...] = (
    Row("anonymous", "connect to the bus", "refused", f"{_T}::test_anonymous_connect_is_refused"),
    Row(
        "reader (neuron-dra events)",
        "connect with its own token",
        "allowed",
        f"{_T}::test_anonymous_connect_is_refused",
    ),
    Row(
        "token made for another audience",
        "connect to the bus",
        "refused",
        f"{_T}::test_a_token_made_for_another_audience_is_refused",
    ),
    Row(
        "topology allocator",
        "connect with its bus-audience token",
        "allowed",
        f"{_T}::test_a_token_made_for_another_audience_is_refused",
    ),
    Row(
        "discovery of node A",
        "publish node B's inventory and heartbeat",
        "refused",
        f"{_T}::test_discovery_of_node_a_cannot_publish_node_bs_inventory_or_heartbeat",
    ),
    Row(
        "discovery of node A",
        "publish node A's inventory and heartbeat",
        "allowed",
        f"{_T}::test_discovery_of_node_a_cannot_publish_node_bs_inventory_or_heartbeat",
    ),
    Row(
        "discovery of node A",
        "publish an alive beat (ttl heartbeat mode) for node B",
        "refused",
        f"{_A}::test_only_a_nodes_own_agent_beats_alive_and_only_the_detector_reads_them",
    ),
    Row(
        "discovery of node A",
        "publish an alive beat for node A",
        "allowed",
        f"{_A}::test_only_a_nodes_own_agent_beats_alive_and_only_the_detector_reads_them",
    ),
    Row(
        "slice publisher, reader (neuron-dra events)",
        "read an alive beat of NEURON_ALIVE",
        "refused",
        f"{_A}::test_only_a_nodes_own_agent_beats_alive_and_only_the_detector_reads_them",
    ),
    Row(
        "failure detector",
        "ask NEURON_ALIVE which nodes beat, read a node's last alive beat",
        "allowed",
        f"{_A}::test_only_a_nodes_own_agent_beats_alive_and_only_the_detector_reads_them",
    ),
    Row(
        "health probe of node A",
        "publish NodeLost for node A",
        "refused",
        f"{_T}::test_the_health_probe_cannot_declare_its_node_lost_or_report_another_nodes_devices",
    ),
    Row(
        "health probe of node A",
        "publish device health of node B",
        "refused",
        f"{_T}::test_the_health_probe_cannot_declare_its_node_lost_or_report_another_nodes_devices",
    ),
    Row(
        "health probe of node A",
        "publish device health of node A",
        "allowed",
        f"{_T}::test_the_health_probe_cannot_declare_its_node_lost_or_report_another_nodes_devices",
    ),
    Row(
        "failure detector",
        "publish NodeLost for node A",
        "allowed",
        f"{_T}::test_the_health_probe_cannot_declare_its_node_lost_or_report_another_nodes_devices",
    ),
    Row(
        "kubelet plugin of node A",
        "subscribe to _INBOX.>, another identity's or node B's inbox",
        "refused",
        f"{_T}::test_a_node_agent_cannot_read_another_identitys_replies",
    ),
    Row(
        "kubelet plugin of node A",
        "receive its JetStream acks on its own inbox",
        "allowed",
        f"{_T}::test_a_node_agent_cannot_read_another_identitys_replies",
    ),
    Row(
        "kubelet plugin of node A",
        "connect with another identity's inbox prefix",
        "refused",
        f"{_T}::test_a_node_agent_cannot_read_another_identitys_replies",
    ),
    Row(
        "discovery of node A",
        "run as node B (its inbox, its inventory)",
        "refused",
        f"{_C}::test_discovery_publishes_its_own_nodes_inventory_and_cannot_pose_as_another",
    ),
    Row(
        "every node agent, cluster service but the operator, and reader",
        "ask the allocator to release a workload's UltraServers",
        "refused",
        f"{_T}::test_only_the_operator_asks_the_allocator_to_release",
    ),
    Row(
        "UltraServer operator",
        "ask the allocator to release a workload's UltraServers",
        "allowed",
        f"{_T}::test_only_the_operator_asks_the_allocator_to_release",
    ),
    Row(
        "every node agent, cluster service and reader",
        "create, update, purge or delete a stream; delete a consumer",
        "refused",
        f"{_T}::test_no_identity_but_the_admin_changes_streams_or_deletes_consumers",
    ),
    Row(
        "admin (the declare step)",
        "delete a consumer",
        "allowed",
        f"{_T}::test_no_identity_but_the_admin_changes_streams_or_deletes_consumers",
    ),
    Row(
        "admin (the declare step)",
        "create a stream past the account's max_streams",
        "refused",
        f"{_T}::test_the_account_has_at_most_its_streams_and_consumers_per_stream",
    ),
    Row(
        "reader (neuron-dra events)",
        "create a consumer past the account's max_consumers on a stream",
        "refused",
        f"{_T}::test_the_account_has_at_most_its_streams_and_consumers_per_stream",
    ),
    Row(
        "discovery of node A",
        "store past the account's file storage limit",
        "refused",
        f"{_T}::test_a_publisher_cannot_store_past_the_accounts_file_limit",
    ),
    Row(
        "discovery of node A",
        "store its inventory within the account's limit",
        "allowed",
        f"{_T}::test_a_publisher_cannot_store_past_the_accounts_file_limit",
    ),
)
