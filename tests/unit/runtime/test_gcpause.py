"""The garbage collector paused around large decodes and explanations, and what a one-shot
command keeps frozen."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from neuron_dra_common.gcpause import kept, paused, while_paused


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    was = gc.isenabled()
    yield
    gc.unfreeze()
    if was:
        gc.enable()
    else:
        gc.disable()


def test_paused_turns_the_collector_off_for_the_block_only() -> None:
    gc.enable()
    with paused():
        assert not gc.isenabled()
        with paused():
            assert not gc.isenabled()
        # The inner block leaves it as the outer one wants it.
        assert not gc.isenabled()
    assert gc.isenabled()


def test_paused_leaves_a_collector_that_was_off_off() -> None:
    gc.disable()
    with paused():
        pass
    assert not gc.isenabled()


def test_paused_turns_it_back_on_when_the_block_raises() -> None:
    gc.enable()
    with pytest.raises(ValueError, match="bad page"), paused():
        raise ValueError("bad page")
    assert gc.isenabled()


def test_a_function_run_while_paused_sees_the_collector_off() -> None:
    gc.enable()

    @while_paused
    def build(n: int) -> tuple[bool, list[dict[str, int]]]:
        return gc.isenabled(), [{"i": i} for i in range(n)]

    enabled, built = build(3)
    assert enabled is False
    assert built == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert build.__name__ == "build"
    assert gc.isenabled()


def test_what_a_command_keeps_is_frozen_and_the_collector_back_on() -> None:
    gc.enable()
    gc.unfreeze()
    before = gc.get_freeze_count()
    with kept():
        answer = [{"device": f"neurondevice{i}"} for i in range(1000)]
        assert not gc.isenabled()
    assert gc.isenabled()
    assert gc.get_freeze_count() >= before + len(answer)
