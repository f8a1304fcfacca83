"""What the extender decides: which set a pod gets, and which requests it refuses."""

from __future__ import annotations

import pytest
from neuron_dra_scheduler_extender.decide import Placement, Unfit, judge, place, score
from neuron_dra_scheduler_extender.inputs import CORE_RESOURCE, DEVICE_RESOURCE, Ask

from .helpers import shape

TRN1_7 = (
    "Instance type trn1.32xlarge does not support requests for device: 7. "
    "Please request a different number of devices."
)


def devices(n: int) -> Ask:
    return Ask(resource=DEVICE_RESOURCE, count=n)


def cores(n: int) -> Ask:
    return Ask(resource=CORE_RESOURCE, count=n)


def test_seven_devices_on_trn1_are_refused_with_aws_text() -> None:
    verdict = judge(shape("trn1.32xlarge"), devices(7), ())
    assert verdict == Unfit(message=TRN1_7, final=True)


@pytest.mark.parametrize("count", [2, 3, 5, 6, 7, 9, 12, 15, 17])
def test_torus_counts_other_than_1_4_8_16_are_refused(count: int) -> None:
    verdict = judge(shape("trn2.48xlarge"), devices(count), ())
    assert isinstance(verdict, Unfit)
    assert verdict.final
    assert verdict.message == (
        f"Instance type trn2.48xlarge does not support requests for device: {count}. "
        "Please request a different number of devices."
    )


def test_three_devices_on_inf2_are_a_contiguous_window() -> None:
    got = place(shape("inf2.48xlarge"), devices(3), ())
    assert got == Placement(devices=(0, 1, 2), cores=(0, 1, 2, 3, 4, 5))


def test_three_devices_on_a_used_inf2_go_next_to_what_is_used() -> None:
    # devices 0 and 1 held: the window 2-4 keeps the longest free run (5-11) whole.
    used = range(0, 4)
    got = place(shape("inf2.48xlarge"), devices(3), used)
    assert got is not None
    assert got.devices == (2, 3, 4)


def test_ring_window_wraps_on_inf2_48xlarge() -> None:
    used = range(2, 22)  # devices 1..10 busy: 11 and 0 are free and linked
    got = place(shape("inf2.48xlarge"), devices(2), used)
    assert got is not None
    assert got.devices == (0, 11)


def test_four_devices_on_trn2_are_one_row() -> None:
    got = place(shape("trn2.48xlarge"), devices(4), ())
    assert got is not None
    assert got.devices == (0, 1, 2, 3)
    assert got.cores == tuple(range(16))  # 4 logical cores per device at LNC=2


def test_four_devices_take_the_row_beside_a_used_one() -> None:
    # Row 2 held: row 3 completes that half, keeping rows 0-1 for an 8-device request.
    used = range(32, 48)
    got = place(shape("trn2.48xlarge"), devices(4), used)
    assert got is not None
    assert got.devices == (12, 13, 14, 15)


def test_eight_devices_are_half_the_torus() -> None:
    got = place(shape("trn1.32xlarge"), devices(8), range(0, 2))
    assert got is not None
    assert got.devices == tuple(range(8, 16))


def test_nine_neuroncores_are_cores_0_to_8() -> None:
    # The seed's example on a 4-core-per-device inf1 node, and on inf2 (2 per device).
    for instance in ("inf1.6xlarge", "inf2.48xlarge"):
        got = place(shape(instance), cores(9), ())
        assert got is not None, instance
        assert got.cores == tuple(range(9)), instance


def test_small_core_requests_fill_a_used_device_first() -> None:
    s = shape("inf1.6xlarge")
    got = place(s, cores(2), (0, 1))
    assert got == Placement(devices=(0,), cores=(2, 3))


def test_cores_spanning_an_invalid_device_count_on_a_torus_are_refused() -> None:
    verdict = judge(shape("trn1.32xlarge"), cores(9), ())  # 5 devices of 2 cores
    assert isinstance(verdict, Unfit)
    assert verdict.final
    assert "does not support requests for neuroncore: 9" in verdict.message


def test_a_full_node_is_unfit_for_now_not_for_ever() -> None:
    s = shape("trn2.48xlarge")
    verdict = judge(s, devices(4), range(0, 60))
    assert verdict == Unfit(
        message="node n0 has no 4 connected Neuron devices free (1 of 16 devices free)",
        final=False,
    )


def test_one_and_all_are_valid_everywhere() -> None:
    for instance in ("inf1.24xlarge", "inf2.24xlarge", "trn1.32xlarge", "trn2.48xlarge"):
        s = shape(instance)
        assert place(s, devices(1), ()) is not None
        assert place(s, devices(s.devices), ()) is not None
        assert place(s, cores(1), ()) is not None
        assert place(s, cores(s.total_cores), ()) is not None


def test_score_prefers_the_fuller_node() -> None:
    s = shape("trn2.48xlarge")
    assert score(s, devices(4), range(32)) > score(s, devices(4), ())
    assert score(s, devices(16), ()) == 10
    assert score(s, devices(8), range(4, 36)) == 0  # does not fit
