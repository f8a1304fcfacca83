"""Secure defaults: the bus a default install or `neuron-dra dev up` runs admits only
authenticated clients over TLS, a service without credentials does not start, the named
insecure mode says so, NATS's monitoring port is not reachable from outside its pod, and the
install Job that makes the bus's Secrets may do nothing else with Secrets."""

from __future__ import annotations

from tests.attacks import Row

_CREDENTIALS = "tests/integration/runtime/test_bus_credentials.py"
_DEFAULT_STACK = "tests/e2e/busauth/test_default_stack.py"
_SECRETS_JOB = "tests/integration/deploy/test_bus_secrets_job.py"

ROWS: tuple[Row, ...] = (
    Row(
        "anonymous client (trusts NATS's CA, no token)",
        "connect to the bus of `neuron-dra dev up` without flags",
        "refused",
        f"{_DEFAULT_STACK}::test_an_anonymous_client_is_refused_by_the_default_stack",
    ),
    Row(
        "every service of `neuron-dra dev up` without flags",
        "connect with its own ServiceAccount's bus token over TLS",
        "allowed",
        f"{_DEFAULT_STACK}::test_every_service_of_the_default_stack_connects_with_its_own_token",
    ),
    Row(
        "service started without bus credentials (no token file or no TLS CA)",
        "start and connect to NATS",
        "refused",
        f"{_CREDENTIALS}::test_a_service_without_bus_credentials_refuses_to_start",
    ),
    Row(
        "service started with NEURON_DRA_INSECURE_BUS=1",
        "connect to an open bus (with a WARNING at start that it is open)",
        "allowed",
        f"{_CREDENTIALS}::test_the_insecure_mode_connects_and_says_the_bus_is_open",
    ),
    Row(
        "anyone outside the NATS pod",
        "reach NATS's monitoring port (/varz, /jsz, /healthz)",
        "refused",
        "tests/integration/deploy/test_nats_config.py::"
        "test_the_monitoring_port_answers_inside_the_pod_only",
    ),
    Row(
        "neuron-dra-bus-secrets (the install Job)",
        "read, list, change or delete a Secret; create one in another namespace",
        "refused",
        f"{_SECRETS_JOB}::test_the_jobs_identity_may_create_secrets_and_nothing_else",
    ),
    Row(
        "an install upgraded from the open bus",
        "keep every stored event and durable consumer's position under the callout",
        "allowed",
        "tests/integration/deploy/test_upgrade_to_auth.py::"
        "test_the_open_bus_streams_move_to_the_authenticated_account",
    ),
    Row(
        "neuron-dra-bus-secrets (the install Job)",
        "create the bus's missing Secrets, keep existing ones",
        "allowed",
        f"{_SECRETS_JOB}::test_the_job_makes_both_secrets_once_and_keeps_them",
    ),
)
