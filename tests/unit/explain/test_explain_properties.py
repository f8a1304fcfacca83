"""The search agrees with brute force: for any set of held devices and any request on a trn2
pool, it fits exactly when some set of free devices satisfies the request (count, selector and
matchAttribute), whether the single-request shortcut or the full backtracking answers."""

from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st
from neuron_dra_common.explain import explain_pod

from tests.unit.explain.cluster import claim, pod, request, slices, snapshot

GROUPS = ("resource.aws.com/devicegroup4_id", "resource.aws.com/devicegroup8_id")
POOL = next(s for s in slices("trn2-0") if "devices" in s["spec"])["spec"]["devices"]


def value(device: int, attribute: str) -> str:
    return str(POOL[device]["attributes"][attribute]["string"])


def brute_force(
    free: set[int], count: int, attribute: str | None, max_id: int, *, extra: bool
) -> bool:
    """Some ``count`` free devices with deviceId <= max_id sharing ``attribute``, and, with
    ``extra``, one more free device (the constraint covers every request: it shares it too)."""
    for chosen in combinations([i for i in sorted(free) if i <= max_id], count):
        if attribute and len({value(i, attribute) for i in chosen}) != 1:
            continue
        if not extra:
            return True
        rest = free - set(chosen)
        if attribute:
            rest = {i for i in rest if value(i, attribute) == value(chosen[0], attribute)}
        if rest:
            return True
    return False


@settings(max_examples=60, deadline=None)
@given(
    held=st.sets(st.integers(0, 15), max_size=15),
    count=st.integers(1, 8),
    attribute=st.sampled_from((None, *GROUPS)),
    max_id=st.integers(3, 15),
    second=st.booleans(),
)
def test_fits_exactly_when_a_solution_exists(
    held: set[int], count: int, attribute: str | None, max_id: int, second: bool
) -> None:
    selector = f"device.attributes['neuron.aws.com'].deviceId <= {max_id}"
    constraints = [{"matchAttribute": attribute}] if attribute else None
    wanted = [request("neurons", count, selector)]
    if second:
        # A second request of one device forces the full backtracking.
        wanted.append(request("extra", 1))
    objects = [claim("c", *wanted, constraints=constraints), pod("p", "c")]
    if held:
        objects.append(
            claim(
                "h",
                request("neurons", len(held)),
                allocated_on="trn2-0",
                devices=[f"neurondevice{i}" for i in held],
            )
        )
    exp = explain_pod(snapshot({"trn2-0": "trn2.48xlarge"}, *objects), "default", "p")
    expected = brute_force(set(range(16)) - held, count, attribute, max_id, extra=second)
    assert exp.summary.schedulable is expected
