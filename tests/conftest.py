"""Shared fixtures: real servers started on free ports (see tests/fixtures/)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = [
    "tests.fixtures.stack",
    "tests.fixtures.nats",
    "tests.fixtures.subscribers",
    "tests.fixtures.image",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--floor-needed-file",
        default="",
        help="with --collect-only: write 'yes' to this file if a selected test runs on the "
        "oldest supported Kubernetes release (marker floor), else 'no'; the test command "
        "builds that release only when it is needed",
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    path = session.config.getoption("--floor-needed-file")
    if path:
        needed = any(item.get_closest_marker("floor") for item in session.items)
        Path(path).write_text("yes\n" if needed else "no\n")
