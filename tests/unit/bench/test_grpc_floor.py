"""``bench.grpc_floor``: every way of serving it answers the prepare benchmark's calls."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest

from bench.grpc_floor import MODES
from bench.scenarios.prepare import Caller, _start_floor, _stop


@pytest.mark.parametrize("mode", [*MODES, "aio-bare+nobdp", "aio+wait"])
def test_each_mode_prepares_and_unprepares(mode: str) -> None:
    # Unix socket paths are limited to 107 bytes: a short root, not pytest's tmp_path.
    with tempfile.TemporaryDirectory(prefix="bfl-", dir="/tmp") as root:
        floor = _start_floor(Path(root), 2, mode)
        try:

            async def cycle() -> None:
                caller = Caller(floor)
                try:
                    await caller.cycles(1, 0, 3)
                finally:
                    await caller.close()

            asyncio.run(cycle())
        finally:
            _stop(floor.proc)
        assert floor.proc.returncode == 0, floor.log.read_text()


def test_an_unknown_mode_is_refused() -> None:
    with (
        tempfile.TemporaryDirectory(prefix="bfl-", dir="/tmp") as root,
        pytest.raises(RuntimeError, match="exited with 1"),
    ):
        _start_floor(Path(root), 2, "threads")
