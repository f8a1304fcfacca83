"""The extender's decisions: can a node serve a request, how well, and with which devices.

Pure functions over a :class:`~neuron_dra_scheduler_extender.inputs.NodeShape`, an
:class:`~neuron_dra_scheduler_extender.inputs.Ask` and the node's used NeuronCores (host-global
logical core ids). Connected sets and valid counts come from the topology engine
(``neuron_dra_common.topology``); nothing here re-states them.

* **Devices** (``aws.amazon.com/neuron``): one of the instance's connected sets of that size
  (ring windows on inf1/inf2, rows and pairs of rows on trn1/trn2), made of devices none of
  whose cores is used. Among the free sets the one that leaves the most connected sets free
  is taken (best fit: a 4-device request takes a row next to a used one rather than split the
  other half of the torus); ties go to the lowest ids.
* **NeuronCores** (``aws.amazon.com/neuroncore``): packed on as few devices as possible.
  ``k`` cores that fit on one device go to the device with the fewest free cores that still
  holds them; more take ``ceil(k / cores per device)`` devices forming a connected set, all
  whole but one that holds the rest (9 cores on 4-core devices: ``0-7`` and ``8``). That
  device count must be one the instance accepts: on a torus, 9 cores of 2-core devices
  would span 5 devices that are not connected, and are refused.
* **Refusals**: a device count the instance cannot serve is refused with AWS's scheduler
  extension text, verbatim (``Instance type trn1.32xlarge does not support requests for
  device: 7. Please request a different number of devices.``); a core count in the same words
  for cores. A refusal is final for the node (no preemption can help).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

import msgspec
from neuron_dra_common.topology import (
    InstanceSpec,
    InvalidDeviceCount,
    LinkTopology,
    check_request,
    connected_sets,
    instance_spec,
    valid_counts,
)

from neuron_dra_scheduler_extender.api import MAX_PRIORITY
from neuron_dra_scheduler_extender.inputs import Ask, NodeShape

__all__ = [
    "Placement",
    "Unfit",
    "Usage",
    "fits",
    "judge",
    "place",
    "refusal",
    "score",
    "unfit",
    "verdict",
]


class Placement(msgspec.Struct, frozen=True, kw_only=True):
    """The devices a pod gets and the NeuronCores it may use on them (host-global ids)."""

    devices: tuple[int, ...]
    cores: tuple[int, ...]


class Unfit(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Why a node cannot serve a pod; ``final`` when it never will (an invalid count)."""

    # gc=False: a string and a flag can hold no cycle, and the extender keeps one per node
    # and kind of request: the garbage collector's full passes need not walk them.

    message: str
    final: bool


@lru_cache(maxsize=256)
def _sets(spec: InstanceSpec, count: int) -> tuple[tuple[tuple[int, ...], int], ...]:
    """Connected sets of ``count`` devices with their bitmasks, in the engine's order."""
    return tuple((s, _mask(s)) for s in connected_sets(spec, count))


@lru_cache(maxsize=64)
def _options(spec: InstanceSpec) -> tuple[int, ...]:
    """Every connected set of every valid count, as bitmasks: what a node can still offer."""
    return tuple(mask for n in valid_counts(spec) for _, mask in _sets(spec, n))


def _mask(devices: Iterable[int]) -> int:
    out = 0
    for d in devices:
        out |= 1 << d
    return out


def _remaining(spec: InstanceSpec, busy: int) -> int:
    """How many connected sets stay wholly free when the devices of ``busy`` are taken."""
    if spec.topology is LinkTopology.ALL_TO_ALL:
        # Every subset is connected: what is left is simply how many devices are free.
        return spec.devices - busy.bit_count()
    return sum(1 for option in _options(spec) if option & busy == 0)


class Usage:
    """A node's used cores seen per device (build it once per node state and reuse it: the
    extender keeps one per node until the node's allocations change)."""

    def __init__(self, shape: NodeShape, used: Iterable[int]) -> None:
        self.shape = shape
        self.used = frozenset(used)
        self.free_cores = [
            sum(1 for c in shape.device_cores(d) if c not in self.used)
            for d in range(shape.devices)
        ]
        self.busy = _mask(
            d for d in range(shape.devices) if self.free_cores[d] < shape.cores_per_device
        )

    def whole(self, device: int) -> bool:
        return not self.busy >> device & 1

    def lowest_free_cores(self, device: int, count: int) -> list[int]:
        return [c for c in self.shape.device_cores(device) if c not in self.used][:count]


def refusal(shape: NodeShape, ask: Ask) -> str | None:
    """AWS's refusal text when ``shape`` can never serve ``ask``, else None."""
    return _refusal(
        shape.instance_type, shape.spec.name, shape.cores_per_device, ask.cores, ask.count
    )


@lru_cache(maxsize=4096)
def _refusal(instance_type: str, name: str, per: int, cores: bool, k: int) -> str | None:
    # Asked for every candidate node of every call: cached per kind of node and request.
    spec = instance_spec(name)
    if not cores:
        try:
            check_request(instance_type, k)
        except InvalidDeviceCount as exc:
            return str(exc)
        return None
    devices_needed = -(-k // per)
    if k > spec.devices * per or (k > per and devices_needed not in valid_counts(spec)):
        return (
            f"Instance type {instance_type} does not support requests for neuroncore: "
            f"{k}. Please request a different number of cores."
        )
    return None


def _usage(shape: NodeShape, used: Usage | Iterable[int]) -> Usage:
    return used if isinstance(used, Usage) else Usage(shape, used)


def place(shape: NodeShape, ask: Ask, used: Usage | Iterable[int]) -> Placement | None:
    """The best placement of ``ask`` on ``shape`` given the ``used`` cores, or None when the
    node cannot serve it now (or ever: see :func:`refusal`).

    >>> from neuron_dra_scheduler_extender.inputs import CORE_RESOURCE
    >>> inf1 = NodeShape(name="n", instance_type="inf1.6xlarge",
    ...                  spec=instance_spec("inf1.6xlarge"), cores_per_device=4)
    >>> place(inf1, Ask(resource=CORE_RESOURCE, count=9), ()).cores
    (0, 1, 2, 3, 4, 5, 6, 7, 8)
    """
    if refusal(shape, ask) is not None:
        return None
    usage = _usage(shape, used)
    if ask.cores:
        return _place_cores(usage, ask.count)
    devices = _place_devices(usage, ask.count)
    if devices is None:
        return None
    cores = tuple(c for d in devices for c in shape.device_cores(d))
    return Placement(devices=devices, cores=cores)


def _place_devices(usage: Usage, count: int) -> tuple[int, ...] | None:
    spec = usage.shape.spec
    if spec.topology is LinkTopology.ALL_TO_ALL:
        whole = [d for d in range(spec.devices) if usage.whole(d)]
        return tuple(whole[:count]) if len(whole) >= count else None
    best: tuple[int, int] | None = None
    chosen: tuple[int, ...] | None = None
    for index, (devices, mask) in enumerate(_sets(spec, count)):
        if mask & usage.busy:
            continue
        key = (_remaining(spec, usage.busy | mask), -index)
        if best is None or key > best:
            best, chosen = key, devices
    return chosen


def _place_cores(usage: Usage, k: int) -> Placement | None:
    shape = usage.shape
    per = shape.cores_per_device
    if k <= per:
        best: tuple[int, int, int] | None = None
        for d in range(shape.devices):
            if usage.free_cores[d] < k:
                continue
            key = (usage.free_cores[d], -_remaining(shape.spec, usage.busy | 1 << d), d)
            if best is None or key < best:
                best = key
        if best is None:
            return None
        device = best[2]
        return Placement(devices=(device,), cores=tuple(usage.lowest_free_cores(device, k)))
    m = shape.devices_needed(k)
    rest = k - (m - 1) * per
    if shape.spec.topology is LinkTopology.ALL_TO_ALL:
        candidates: Iterable[tuple[tuple[int, ...], int]] = _all_to_all_sets(usage, m, rest)
    else:
        candidates = _sets(shape.spec, m)
    best_key: tuple[int, int, int] | None = None
    chosen: tuple[tuple[int, ...], int] | None = None
    for index, (devices, mask) in enumerate(candidates):
        partial = _partial_device(usage, devices, rest)
        if partial is None:
            continue
        key = (usage.free_cores[partial], -_remaining(shape.spec, usage.busy | mask), index)
        if best_key is None or key < best_key:
            best_key, chosen = key, (devices, partial)
    if chosen is None:
        return None
    devices, partial = chosen
    cores = [c for d in devices if d != partial for c in shape.device_cores(d)]
    cores += usage.lowest_free_cores(partial, rest)
    return Placement(devices=devices, cores=tuple(sorted(cores)))


def _partial_device(usage: Usage, devices: tuple[int, ...], rest: int) -> int | None:
    """The device of ``devices`` that takes the ``rest`` cores, the others being whole and
    free; the one with the fewest free cores, the highest id on a tie (so that a set of free
    devices gives contiguous core ids, as AWS's ``0-8``)."""
    taken = [d for d in devices if not usage.whole(d)]
    if len(taken) > 1:
        return None
    if taken:
        return taken[0] if usage.free_cores[taken[0]] >= rest else None
    return max(devices)


def _all_to_all_sets(usage: Usage, m: int, rest: int) -> list[tuple[tuple[int, ...], int]]:
    # Every subset is connected: the m - 1 lowest whole devices, with either the fullest
    # partly used device that holds the rest or one more whole device.
    shape = usage.shape
    whole = [d for d in range(shape.devices) if usage.whole(d)]
    out: list[tuple[tuple[int, ...], int]] = []
    partly = [d for d in range(shape.devices) if not usage.whole(d) and usage.free_cores[d] >= rest]
    if partly and len(whole) >= m - 1:
        d = min(partly, key=lambda x: usage.free_cores[x])
        devices = tuple(sorted([*whole[: m - 1], d]))
        out.append((devices, _mask(devices)))
    if len(whole) >= m:
        out.append((tuple(whole[:m]), _mask(whole[:m])))
    return out


def fits(shape: NodeShape, ask: Ask, used: Usage | Iterable[int]) -> bool:
    """Whether :func:`place` would find a placement, without ranking the candidates: the
    filter's question, asked of every candidate node, so it is kept to a few mask tests."""
    if refusal(shape, ask) is not None:
        return False
    return _fits(shape, ask, _usage(shape, used))


def _fits(shape: NodeShape, ask: Ask, usage: Usage) -> bool:
    spec, per = shape.spec, shape.cores_per_device
    if not ask.cores:
        if spec.topology is LinkTopology.ALL_TO_ALL:
            return shape.devices - usage.busy.bit_count() >= ask.count
        return any(not mask & usage.busy for _, mask in _sets(spec, ask.count))
    k = ask.count
    if k <= per:
        return max(usage.free_cores, default=0) >= k
    if spec.topology is LinkTopology.ALL_TO_ALL:
        return bool(
            _all_to_all_sets(
                usage, shape.devices_needed(k), k - (shape.devices_needed(k) - 1) * per
            )
        )
    rest = k - (shape.devices_needed(k) - 1) * per
    return any(
        _partial_device(usage, devices, rest) is not None
        for devices, _ in _sets(spec, shape.devices_needed(k))
    )


def unfit(shape: NodeShape, ask: Ask, used: Usage | Iterable[int]) -> Unfit | None:
    """Why ``shape`` cannot serve ``ask`` now (or ever), or None when it can."""
    refused = refusal(shape, ask)
    if refused is not None:
        return Unfit(message=refused, final=True)
    usage = _usage(shape, used)
    if _fits(shape, ask, usage):
        return None
    return Unfit(message=_shortfall(ask), final=False)


def _shortfall(ask: Ask) -> str:
    """What a node lacks, in the words of kube-scheduler's reasons.

    The scheduler counts the nodes that failed for each reason text and prints the count
    before it ("0/40 nodes are available: 40 node(s) had no ..."): a text that named the node
    or its free devices would give a Pending pod one line per node instead of one count.
    """
    return f"node(s) had {_lack(ask)}"


def _lack(ask: Ask) -> str:
    if ask.cores:
        return f"no {ask.count} NeuronCores free on connected devices"
    return f"no {ask.count} connected Neuron devices free"


def _free(shape: NodeShape, ask: Ask, usage: Usage) -> str:
    if ask.cores:
        return f"{shape.total_cores - len(usage.used)} of {shape.total_cores} cores free"
    return f"{shape.devices - usage.busy.bit_count()} of {shape.devices} devices free"


#: (instance type, cores per device, used cores, resource, count) -> AWS's refusal, or what
#: the node lacks, or neither and the score: the verdict of every node in that state.
_STATES: dict[tuple[str, int, frozenset[int], str, int], tuple[str | None, str | None, int]] = {}
#: States kept at most (then forgotten at once).
_MAX_STATES = 50_000


def verdict(shape: NodeShape, ask: Ask, used: Usage | Iterable[int]) -> tuple[Unfit | None, int]:
    """:func:`unfit` and :func:`score` together. Worked out once per node state (instance
    type, cores per device, used cores) and request: many nodes of a fleet are in the same
    state (empty, or full), and the answer is the same for all of them."""
    usage = _usage(shape, used)
    key = (shape.instance_type, shape.cores_per_device, usage.used, ask.resource, ask.count)
    known = _STATES.get(key)
    if known is None:
        refused = refusal(shape, ask)
        if refused is not None:
            known = (refused, None, 0)
        elif not _fits(shape, ask, usage):
            known = (None, _shortfall(ask), 0)
        else:
            known = (None, None, _score(shape, ask, usage))
        if len(_STATES) >= _MAX_STATES:
            _STATES.clear()
        _STATES[key] = known
    refused, shortfall, value = known
    if refused is not None:
        return Unfit(message=refused, final=True), 0
    if shortfall is not None:
        return Unfit(message=shortfall, final=False), 0
    return None, value


def judge(shape: NodeShape, ask: Ask, used: Usage | Iterable[int]) -> Placement | Unfit:
    """:func:`place`, or why not, in words for one pod's bind (naming what the node has)."""
    usage = _usage(shape, used)
    placement = place(shape, ask, usage)
    if placement is not None:
        return placement
    why = unfit(shape, ask, usage)
    assert why is not None, "place and fits disagree"
    if why.final:
        return why
    return Unfit(
        message=f"node {shape.name} has {_lack(ask)} ({_free(shape, ask, usage)})", final=False
    )


def score(shape: NodeShape, ask: Ask, used: Usage | Iterable[int]) -> int:
    """0..10: how full the node would be once ``ask`` is placed on it (best fit packs nodes,
    leaving whole nodes free for large requests). Every placement of an ask takes as many
    cores, so the score needs none of them; 0 when the ask does not fit."""
    usage = _usage(shape, used)
    if not fits(shape, ask, usage):
        return 0
    return _score(shape, ask, usage)


def _score(shape: NodeShape, ask: Ask, usage: Usage) -> int:
    taken = ask.count if ask.cores else ask.count * shape.cores_per_device
    return round(MAX_PRIORITY * (len(usage.used) + taken) / shape.total_cores)
