"""A command's coroutine run to its end, its answer handed back whatever its size."""

from __future__ import annotations

import asyncio
import time

import pytest
from neuron_dra_cli.aio import run


class Costly:
    """An answer whose repr is slow to build, as a 1,000-node cluster's slices are."""

    reprs = 0

    def __repr__(self) -> str:
        Costly.reprs += 1
        time.sleep(0.5)
        return "Costly()"


async def answer() -> Costly:
    await asyncio.sleep(0)
    return Costly()


def test_the_answer_comes_back_without_its_repr_being_built() -> None:
    Costly.reprs = 0
    got = run(answer())
    assert isinstance(got, Costly)
    assert Costly.reprs == 0


def test_a_failure_comes_back_as_itself() -> None:
    async def refused() -> None:
        raise PermissionError("not allowed to list resourceslices")

    with pytest.raises(PermissionError, match="not allowed to list resourceslices"):
        run(refused())
