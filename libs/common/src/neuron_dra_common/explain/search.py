"""kube-scheduler's structured allocator for one node, ported from the incubating variant of
Kubernetes 1.36 for the features the product uses (pure).

``solve`` answers as the scheduler would: a solution, no solution, or the error that aborts
the scheduling attempt. Selectors are evaluated lazily in the allocator's order, so an error
counts only when the scheduler would reach it. ``whynot`` says why there is no solution.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any, Literal

import msgspec

from neuron_dra_common.explain.celenv import CannotEvaluate, CelError, DraCel
from neuron_dra_common.explain.model import (
    Claim,
    Constraint,
    Device,
    DeviceClass,
    DeviceId,
    NodeFacts,
    Pool,
    Request,
)
from neuron_dra_common.explain.nodes import selector_matches, tolerates

__all__ = [
    "Allocated",
    "NodeAnswer",
    "Plan",
    "PoolIndex",
    "Search",
    "applies",
    "selector_answer",
    "solve",
    "untolerated",
]

Outcome = Literal["fits", "does-not-fit", "unknown", "scheduler-error"]


class Allocated(msgspec.Struct, frozen=True):
    """Devices other claims hold (``status.allocation``), and who holds them."""

    holders: dict[DeviceId, str]

    @classmethod
    def of(cls, claims: Sequence[Claim]) -> Allocated:
        return cls({device: claim.key for claim in claims for device in claim.allocated})


Answer = tuple[bool, str, "CelError | CannotEvaluate | None"]


class Plan(msgspec.Struct, frozen=True):
    """One request of one claim to allocate, with its class resolved; ``answers`` keeps
    :func:`selector_answer` per device for the explanation the plan is made for (the
    search and the reasons ask the same of the same devices)."""

    claim_index: int
    claim: Claim
    request: Request
    device_class: DeviceClass
    answers: dict[DeviceId, Answer] = msgspec.field(default_factory=dict)


class NodeAnswer(msgspec.Struct, frozen=True):
    outcome: Outcome
    error: str = ""
    cannot: str = ""
    order_dependent: str = ""  # a solution exists, but so does an error the search may hit


class _Stop(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class PoolIndex:
    """The pools a node sees: its own (``nodeName``) and those for all or selected nodes."""

    def __init__(self, pools: Sequence[Pool]) -> None:
        self.by_node: dict[str, list[Pool]] = {}
        self.shared: list[Pool] = []
        for pool in pools:
            if pool.node_name:
                self.by_node.setdefault(pool.node_name, []).append(pool)
            else:
                self.shared.append(pool)

    def for_node(self, node: NodeFacts) -> list[Pool]:
        out = list(self.by_node.get(node.name, ()))
        for pool in self.shared:
            if pool.all_nodes or (
                pool.node_selector and selector_matches(node, pool.node_selector)
            ):
                out.append(pool)
        return sorted(out, key=lambda p: (p.driver, p.name))


def selector_answer(cel: DraCel, plan: Plan, device: Device) -> Answer:
    """(selectable, which selector said no, error or cannot-evaluate), class selectors first."""
    found = plan.answers.get(device.id)
    if found is None:
        found = plan.answers[device.id] = _selector_answer(cel, plan, device)
    return found


def _selector_answer(cel: DraCel, plan: Plan, device: Device) -> Answer:
    for selector in (*plan.device_class.selectors, *plan.request.selectors):
        program = cel.compile(selector.expression)
        if isinstance(program, CannotEvaluate):
            return (
                False,
                "",
                CannotEvaluate(f"selector #{selector.index} of {selector.source}: {program.why}"),
            )
        answer = cel.matches(program, device.value)
        if isinstance(answer, CelError):
            return (
                False,
                "",
                CelError(
                    f"{selector.source}: selector #{selector.index}: CEL runtime error: {answer.message}"
                ),
            )
        if isinstance(answer, CannotEvaluate):
            return (
                False,
                "",
                CannotEvaluate(f"selector #{selector.index} of {selector.source}: {answer.why}"),
            )
        if not answer:
            kind = "class" if selector.source.startswith("class ") else "request"
            return False, f"{kind}#{selector.index}", None
    return True, "", None


def untolerated(device: Device, request: Request) -> list[Any]:
    return [
        t
        for t in device.taints
        if t.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(request.tolerations, t)
    ]


def applies(constraint: Constraint, request: str) -> bool:
    return not constraint.requests or request in constraint.requests


class Search:
    """One node's search, with the allocator's state: devices being allocated, constraint
    values fixed, counters left."""

    def __init__(
        self,
        cel: DraCel,
        plans: Sequence[Plan],
        pools: Sequence[Pool],
        allocated: Allocated,
        *,
        taints: bool = True,
        counters: bool = True,
    ) -> None:
        self.cel, self.plans, self.pools, self.allocated = cel, plans, pools, allocated
        self.taints, self.use_counters = taints, counters
        self.usable = [p for p in pools if p.complete and not p.invalid]
        self.devices = [d for p in self.usable for d in p.devices]
        self.pool_of = {d.id: p for p in self.usable for d in p.devices}
        self.allocating: dict[DeviceId, set[int]] = {}
        self.values: dict[tuple[int, str], Any] = {}
        self.cache: dict[tuple[int, DeviceId], bool] = {}
        self.cannot = ""
        self.counters = self._free_counters()
        self.all_devices: dict[int, list[Device]] = {}

    def _free_counters(self) -> dict[tuple[str, str, str], Fraction]:
        free: dict[tuple[str, str, str], Fraction] = {}
        for pool in self.pools:
            if not pool.counters:
                continue
            for counter_set, counters in pool.counters.items():
                for name, value in counters.items():
                    free[(pool.name, counter_set, name)] = value
            for device in pool.devices:
                if device.id not in self.allocated.holders:
                    continue
                for counter_set, used in device.consumes:
                    for name, value in used.items():
                        key = (pool.name, counter_set, name)
                        if key in free:
                            free[key] -= value
        return free

    def in_use(self, device_id: DeviceId) -> bool:
        return device_id in self.allocated.holders or bool(self.allocating.get(device_id))

    def selectable(self, index: int, device: Device) -> bool:
        key = (index, device.id)
        found = self.cache.get(key)
        if found is None:
            ok, _, problem = selector_answer(self.cel, self.plans[index], device)
            if isinstance(problem, CelError):
                raise _Stop(problem.message)
            if isinstance(problem, CannotEvaluate):
                self.cannot = self.cannot or problem.why
            elif device.unsupported:
                self.cannot = self.cannot or f"explain does not evaluate {device.unsupported}"
                ok = False
            found = self.cache[key] = ok
        return found

    def prepare(self) -> None:
        """``validateDeviceRequest`` for every plan: what ``All`` means, or an error."""
        for index, plan in enumerate(self.plans):
            if plan.request.mode != "All":
                continue
            devices = []
            for pool in self.pools:
                if not pool.complete:
                    raise _Stop(
                        f"claim {plan.claim.key}, request {plan.request.name}: asks for all "
                        f"devices, but resource pool {pool.driver}/{pool.name} is currently "
                        "being updated"
                    )
                if pool.invalid:
                    raise _Stop(
                        f"claim {plan.claim.key}, request {plan.request.name}: asks for all "
                        f"devices, but resource pool {pool.driver}/{pool.name} is currently invalid"
                    )
                devices += [d for d in pool.devices if self.selectable(index, d)]
            self.all_devices[index] = devices

    def allocate(self, index: int, device: Device, *, must: bool) -> bool:
        plan = self.plans[index]
        claim = plan.claim_index
        if plan.request.admin_access:
            if claim in self.allocating.get(device.id, ()):
                return False
        elif self.in_use(device.id):
            return False
        spent: list[tuple[tuple[str, str, str], Fraction]] = []
        if self.use_counters and device.consumes:
            pool = self.pool_of[device.id]
            for counter_set, counters in device.consumes:
                for name, value in counters.items():
                    key = (pool.name, counter_set, name)
                    spent.append((key, value))
            if any(self.counters.get(key, Fraction(0)) < value for key, value in spent):
                return False
        if self.taints and untolerated(device, plan.request):
            return False
        fixed: list[int] = []
        for c_index, constraint in enumerate(plan.claim.constraints):
            if not applies(constraint, plan.request.name):
                continue
            found = device.attribute(constraint.attribute)
            current = self.values.get((claim, constraint.attribute + f"#{c_index}"))
            if found is None or (current is not None and current[0] != found):
                if must:
                    raise _Stop(
                        f"claim {plan.claim.key}, request {plan.request.name}: cannot add device "
                        f"{'/'.join(device.id)} because a claim constraint would not be satisfied"
                    )
                for undo in fixed:
                    self._unfix(claim, plan, undo)
                return False
            self.values[(claim, constraint.attribute + f"#{c_index}")] = (
                found,
                (current[1] if current else 0) + 1,
            )
            fixed.append(c_index)
        for key, value in spent:
            self.counters[key] -= value
        self.allocating.setdefault(device.id, set()).add(claim)
        self._undo.append((index, device, spent, fixed))
        return True

    def _unfix(self, claim: int, plan: Plan, c_index: int) -> None:
        key = (claim, plan.claim.constraints[c_index].attribute + f"#{c_index}")
        value, count = self.values[key]
        if count <= 1:
            del self.values[key]
        else:
            self.values[key] = (value, count - 1)

    def deallocate(self) -> None:
        index, device, spent, fixed = self._undo.pop()
        plan = self.plans[index]
        for key, value in spent:
            self.counters[key] += value
        for c_index in fixed:
            self._unfix(plan.claim_index, plan, c_index)
        self.allocating[device.id].discard(plan.claim_index)

    def run(self) -> bool:
        self._undo: list[tuple[int, Device, list[Any], list[int]]] = []
        self.prepare()
        # Requests without adminAccess never share a device: when they need more than the
        # node has free, the (exponential) search cannot succeed.
        need = sum(self.need(i) for i, p in enumerate(self.plans) if not p.request.admin_access)
        free = sum(1 for d in self.devices if d.id not in self.allocated.holders)
        found = need <= free and self.quick()
        if found is None:
            found = self.one(0, 0, 0)
        if not found:
            self.reach()
        return found

    def quick(self) -> bool | None:
        """One ExactCount request under at most one matchAttribute: "some value has ``count``
        eligible devices" is what the backtracking finds (its first device fixes the value),
        as long as the chosen devices' counters are disjoint. None: use the full search."""
        if len(self.plans) != 1:
            return None
        plan = self.plans[0]
        request = plan.request
        constraints = [c for c in plan.claim.constraints if applies(c, request.name)]
        if request.mode != "ExactCount" or request.admin_access or len(constraints) > 1:
            return None
        attribute = constraints[0].attribute if constraints else ""
        groups: dict[Any, list[Device]] = {}
        for device in self.devices:
            if self.in_use(device.id) or not self.selectable(0, device):
                continue
            if self.taints and untolerated(device, request):
                continue
            if not self._counters_free(device):
                continue
            value: Any = ""
            if attribute:
                value = device.attribute(attribute)
                if value is None:
                    continue
            group = groups.setdefault(value, [])
            group.append(device)
            if len(group) == request.count:
                keys = [k for d in group for k in self._counter_keys(d)]
                return True if len(keys) == len(set(keys)) else None
        return False

    def _counter_keys(self, device: Device) -> list[tuple[str, str, str]]:
        if not self.use_counters:
            return []
        pool = self.pool_of[device.id]
        return [(pool.name, s, n) for s, used in device.consumes for n in used]

    def _counters_free(self, device: Device) -> bool:
        if not self.use_counters or not device.consumes:
            return True
        pool = self.pool_of[device.id]
        return all(
            self.counters.get((pool.name, s, n), Fraction(0)) >= v
            for s, used in device.consumes
            for n, v in used.items()
        )

    def reach(self) -> None:
        """Evaluate what the scheduler's exhaustive search would have evaluated before giving
        up (each request's devices, as long as the earlier requests had enough), so that an
        error it would hit is raised here too."""
        for index, plan in enumerate(self.plans):
            if plan.request.mode == "All":
                if len(self.all_devices[index]) == 0:
                    return
                continue
            selectable = 0
            for device in self.devices:
                if device.id in self.allocated.holders and not plan.request.admin_access:
                    continue
                selectable += self.selectable(index, device)
            if selectable < plan.request.count:
                return

    def need(self, index: int) -> int:
        plan = self.plans[index]
        if plan.request.mode == "All":
            return len(self.all_devices[index])
        return plan.request.count

    def one(self, index: int, k: int, start: int) -> bool:
        if index >= len(self.plans):
            return True
        plan = self.plans[index]
        if plan.request.mode == "All" and not self.all_devices[index]:
            return False
        if k >= self.need(index):
            return self.one(index + 1, 0, 0)
        if plan.request.mode == "All":
            if not self.allocate(index, self.all_devices[index][k], must=True):
                return False
            if self.one(index, k + 1, 0):
                return True
            self.deallocate()
            return False
        if len(self.devices) - start < self.need(index) - k:
            return False
        for position in range(start, len(self.devices)):
            device = self.devices[position]
            if plan.request.admin_access:
                if plan.claim_index in self.allocating.get(device.id, ()):
                    continue
            elif self.in_use(device.id):
                continue
            if not self.selectable(index, device):
                continue
            if not self.allocate(index, device, must=False):
                continue
            if self.one(index, k + 1, position + 1):
                return True
            self.deallocate()
        return False


def solve(
    cel: DraCel,
    plans: Sequence[Plan],
    pools: Sequence[Pool],
    allocated: Allocated,
    *,
    taints: bool = True,
    counters: bool = True,
) -> NodeAnswer:
    """The scheduler's answer for one node's pools."""
    unsupported = next((p.request.unsupported for p in plans if p.request.unsupported), "")
    unsupported = unsupported or next(
        (c.unsupported for p in plans for c in p.claim.constraints if c.unsupported), ""
    )
    unsupported = unsupported or next((p.unsupported for p in pools if p.unsupported), "")
    if unsupported:
        return NodeAnswer("unknown", cannot=f"explain does not evaluate {unsupported}")
    search = Search(cel, plans, pools, allocated, taints=taints, counters=counters)
    try:
        found = search.run()
    except _Stop as stop:
        return NodeAnswer("scheduler-error", error=stop.message)
    if found:
        return NodeAnswer("fits", order_dependent=_unreached_error(cel, plans, search))
    if search.cannot:
        return NodeAnswer("unknown", cannot=search.cannot)
    return NodeAnswer("does-not-fit")


def _unreached_error(cel: DraCel, plans: Sequence[Plan], search: Search) -> str:
    # The scheduler tries pools in an order Go's map iteration decides: an error on a device
    # this search did not reach may be reached first there.
    for index, plan in enumerate(plans):
        for device in search.devices:
            if device.id in search.allocated.holders or (index, device.id) in search.cache:
                continue
            _, _, problem = selector_answer(cel, plan, device)
            if isinstance(problem, CelError):
                return problem.message
    return ""
