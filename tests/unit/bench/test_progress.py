"""Progress on stderr: a line per phase start and end, and the tally every few seconds."""

from __future__ import annotations

import asyncio
import io

import pytest

from bench.progress import Progress


async def test_a_phase_says_its_start_its_tally_while_it_runs_and_its_end() -> None:
    out = io.StringIO()
    progress = Progress("scale 1,000", stream=out, every=0.05)
    async with progress.phase("slices written", 2000) as tally:
        tally.done = 150
        await asyncio.sleep(0.08)
        tally.done = 2000
    lines = out.getvalue().splitlines()
    assert lines[0] == "[scale 1,000 +0 s] slices written ..."
    assert "[scale 1,000 +0 s] slices written: 150/2,000" in lines
    assert lines[-1].startswith("[scale 1,000 +0 s] slices written: done 2,000/2,000 in 0.")


async def test_a_phase_reads_a_count_and_says_when_it_failed() -> None:
    out = io.StringIO()
    registered = [0]
    progress = Progress("scale 100", stream=out, every=10.0)

    async def register() -> None:
        async with progress.phase("nodes registered", 100, lambda: registered[0]):
            registered[0] = 40
            raise RuntimeError("apiserver down")

    with pytest.raises(RuntimeError):
        await register()
    assert (
        out.getvalue()
        .splitlines()[-1]
        .startswith("[scale 100 +0 s] nodes registered: FAILED at 40/100 after 0.")
    )


async def test_a_phase_without_a_total_says_it_is_still_running() -> None:
    out = io.StringIO()
    async with Progress("scale 100", stream=out, every=0.03).phase("bare write loop"):
        await asyncio.sleep(0.05)
    assert "[scale 100 +0 s] bare write loop: still running" in out.getvalue().splitlines()
