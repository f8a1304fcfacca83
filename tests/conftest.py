"""Shared fixtures: real servers started on free ports (see tests/fixtures/)."""

pytest_plugins = [
    "tests.fixtures.stack",
    "tests.fixtures.nats",
]
