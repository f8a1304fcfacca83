"""The operator's crash points: off unless asked for, and a wrong name is refused at start."""

from __future__ import annotations

import pytest
from neuron_dra_ultraserver_operator.faults import CRASH_ENV, STEPS, from_env, no_crash


def test_no_variable_means_no_crash_point() -> None:
    assert from_env({}) is no_crash


def test_an_unknown_step_is_refused_naming_the_variable() -> None:
    with pytest.raises(ValueError, match=CRASH_ENV) as caught:
        from_env({CRASH_ENV: "allocate:nowhere"})
    assert "allocate:granted" in str(caught.value)


def test_other_steps_pass_by() -> None:
    crash = from_env({CRASH_ENV: STEPS[-1]})
    for step in STEPS[:-1]:
        crash(step)  # still alive
