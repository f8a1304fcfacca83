"""kube-scheduler's structured allocator for one node, ported from the incubating variant of
Kubernetes 1.36 for the features the product uses (pure).

``solve`` answers as the scheduler would: a solution, no solution, or the error that aborts
the scheduling attempt. Selectors are evaluated lazily in the allocator's order, so an error
counts only when the scheduler would reach it. ``why_not`` then counts, per request, which
check removed each device, and says which of them explains the failure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
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
from neuron_dra_common.explain.reasons import Code
from neuron_dra_common.explain.result import Reason

__all__ = ["Allocated", "NodeAnswer", "Plan", "PoolIndex", "solve", "why_not"]

Outcome = Literal["fits", "does-not-fit", "unknown", "scheduler-error"]


class Allocated(msgspec.Struct, frozen=True):
    """Devices other claims hold (``status.allocation``), and who holds them."""

    holders: dict[DeviceId, str]

    @classmethod
    def of(cls, claims: Sequence[Claim]) -> Allocated:
        return cls({device: claim.key for claim in claims for device in claim.allocated})


class Plan(msgspec.Struct, frozen=True):
    """One request of one claim to allocate, with its class resolved."""

    claim_index: int
    claim: Claim
    request: Request
    device_class: DeviceClass


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


def selector_answer(
    cel: DraCel, plan: Plan, device: Device
) -> tuple[bool, str, CelError | CannotEvaluate | None]:
    """(selectable, which selector said no, error or cannot-evaluate), class selectors first."""
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


def _applies(constraint: Constraint, request: str) -> bool:
    return not constraint.requests or request in constraint.requests


class _Search:
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
            if not _applies(constraint, plan.request.name):
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
        constraints = [c for c in plan.claim.constraints if _applies(c, request.name)]
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
    search = _Search(cel, plans, pools, allocated, taints=taints, counters=counters)
    try:
        found = search.run()
    except _Stop as stop:
        return NodeAnswer("scheduler-error", error=stop.message)
    if found:
        return NodeAnswer("fits", order_dependent=_unreached_error(cel, plans, search))
    if search.cannot:
        return NodeAnswer("unknown", cannot=search.cannot)
    return NodeAnswer("does-not-fit")


def _unreached_error(cel: DraCel, plans: Sequence[Plan], search: _Search) -> str:
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


class _Tally(msgspec.Struct):
    total: int = 0
    held: dict[str, list[str]] = {}
    class_no: dict[str, list[str]] = {}
    request_no: dict[str, list[str]] = {}
    tainted: dict[str, list[str]] = {}
    counters: dict[str, list[str]] = {}
    cannot: dict[str, list[str]] = {}
    eligible: list[Device] = []


def _tally(
    cel: DraCel,
    plan: Plan,
    devices: Sequence[Device],
    pool_of: Mapping[DeviceId, Pool],
    allocated: Allocated,
    free: Mapping[tuple[str, str, str], Fraction],
    *,
    taints: bool,
    counters: bool,
) -> _Tally:
    tally = _Tally(
        total=len(devices),
        held={},
        class_no={},
        request_no={},
        tainted={},
        counters={},
        cannot={},
        eligible=[],
    )
    for device in devices:
        holder = allocated.holders.get(device.id)
        if holder is not None and not plan.request.admin_access:
            tally.held.setdefault(holder, []).append(device.name)
            continue
        ok, which, problem = selector_answer(cel, plan, device)
        if problem is not None:
            why = problem.why if isinstance(problem, CannotEvaluate) else problem.message
            tally.cannot.setdefault(why, []).append(device.name)
            continue
        if not ok:
            kind, _, number = which.partition("#")
            bucket = tally.class_no if kind == "class" else tally.request_no
            bucket.setdefault(number, []).append(device.name)
            continue
        if counters and device.consumes:
            pool = pool_of[device.id]
            short = [
                f"{counter_set}/{name}"
                for counter_set, used in device.consumes
                for name, value in used.items()
                if free.get((pool.name, counter_set, name), Fraction(0)) < value
            ]
            if short:
                tally.counters.setdefault(short[0].split("/")[0], []).append(device.name)
                continue
        if taints:
            bad = untolerated(device, plan.request)
            if bad:
                text = ",".join(f"{t.get('key')}:{t.get('effect')}" for t in bad)
                tally.tainted.setdefault(text, []).append(device.name)
                continue
        tally.eligible.append(device)
    return tally


def _names(names: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def why_not(
    cel: DraCel,
    plans: Sequence[Plan],
    pools: Sequence[Pool],
    allocated: Allocated,
    *,
    taints: bool = True,
    counters: bool = True,
) -> list[Reason]:
    """Why ``solve`` found no solution on this node: per request, what removed its devices;
    then whether a constraint or the requests together are what fails."""
    reasons: list[Reason] = []
    for pool in pools:
        if not pool.complete:
            reasons.append(
                Reason(
                    code=Code.POOL_INCOMPLETE,
                    message=f"pool {pool.driver}/{pool.name} is being updated "
                    f"({pool.slices_seen} of {pool.slice_count} slices)",
                    subject=f"{pool.driver}/{pool.name}",
                )
            )
        elif pool.invalid:
            reasons.append(
                Reason(
                    code=Code.POOL_INVALID,
                    message=f"pool {pool.driver}/{pool.name} is invalid: {pool.invalid}",
                    subject=f"{pool.driver}/{pool.name}",
                )
            )
    search = _Search(cel, plans, pools, allocated, taints=taints, counters=counters)
    if not search.devices:
        if not pools:
            reasons.append(
                Reason(code=Code.NO_POOL, message="no ResourceSlice offers devices to this node")
            )
        return reasons
    fits_alone = True
    by_name = {d.name: d for d in search.devices}
    for plan in plans:
        tally = _tally(
            cel,
            plan,
            search.devices,
            search.pool_of,
            allocated,
            search.counters,
            taints=taints,
            counters=counters,
        )
        need = (
            plan.request.count if plan.request.mode == "ExactCount" else max(1, len(tally.eligible))
        )
        claim, request = plan.claim.key, plan.request.name
        where = f"request {request} of claim {claim}"
        own: list[Reason] = []
        for number, names in sorted(tally.request_no.items()):
            selector = plan.request.selectors[int(number)]
            own.append(
                Reason(
                    code=Code.REQUEST_SELECTOR,
                    message=f"{len(names)} of {tally.total} devices do not pass {where} selector "
                    f"#{number} ({selector.expression} is false"
                    f"{_values_read(selector.expression, by_name[names[0]])}), "
                    f"e.g. {_names(names, 3)}",
                    claim=claim,
                    request=request,
                    subject=f"#{number}",
                    details={"devices": len(names), "expression": selector.expression},
                )
            )
        for number, names in sorted(tally.class_no.items()):
            selector = plan.device_class.selectors[int(number)]
            own.append(
                Reason(
                    code=Code.CLASS_SELECTOR,
                    message=f"{len(names)} of {tally.total} devices do not pass class "
                    f"{plan.device_class.name} selector #{number} ({selector.expression} is false)",
                    claim=claim,
                    request=request,
                    subject=f"{plan.device_class.name}#{number}",
                    details={"devices": len(names), "expression": selector.expression},
                )
            )
        if tally.held:
            held = sum(len(v) for v in tally.held.values())
            by = "; ".join(
                f"{holder}: {_names(names)}" for holder, names in sorted(tally.held.items())
            )
            own.append(
                Reason(
                    code=Code.DEVICES_HELD,
                    message=f"{held} of {tally.total} devices are held by other claims ({by})",
                    claim=claim,
                    request=request,
                    details={
                        "devices": held,
                        "by": [
                            {"claim": holder, "devices": names}
                            for holder, names in sorted(tally.held.items())
                        ],
                    },
                )
            )
        for taint, names in sorted(tally.tainted.items()):
            own.append(
                Reason(
                    code=Code.DEVICE_TAINTED,
                    message=f"{len(names)} devices carry the device taint {taint} that {where} does "
                    f"not tolerate ({_names(names)})",
                    claim=claim,
                    request=request,
                    subject=taint,
                    details={"devices": names, "taint": taint},
                )
            )
        for counter_set, names in sorted(tally.counters.items()):
            own.append(
                Reason(
                    code=Code.COUNTER_SPENT,
                    message=f"{len(names)} devices share counters ({counter_set}) with devices "
                    f"already allocated ({_names(names)})",
                    claim=claim,
                    request=request,
                    subject=counter_set,
                    details={"devices": names},
                )
            )
        for why, names in sorted(tally.cannot.items()):
            code = Code.CANNOT_EVALUATE
            if "CEL runtime error" in why:
                code = Code.SCHEDULER_ERROR
            own.append(
                Reason(
                    code=code,
                    message=f"{why} ({len(names)} devices)",
                    claim=claim,
                    request=request,
                    subject=why,
                )
            )
        eligible = len(tally.eligible)
        if plan.request.mode == "All":
            short = eligible == 0 or bool(tally.held or tally.tainted or tally.counters)
            if eligible == 0 and not own:
                own.append(
                    Reason(
                        code=Code.NOT_ENOUGH_DEVICES,
                        message=f"{where} asks for all matching devices, and none matches",
                        claim=claim,
                        request=request,
                    )
                )
        else:
            short = eligible < need
            if short and not own:
                own.append(
                    Reason(
                        code=Code.NOT_ENOUGH_DEVICES,
                        message=f"{where} asks for {need} devices; the node has {tally.total}",
                        claim=claim,
                        request=request,
                        subject=f"has {tally.total}",
                        details={"need": need, "devices": tally.total},
                    )
                )
        if short:
            fits_alone = False
            reasons += own
            continue
        connected = _connection(plan, tally.eligible, need)
        if connected is not None:
            fits_alone = False
            reasons.append(connected)
    if fits_alone and plans:
        claims = sorted({p.claim.key for p in plans})
        reasons.append(
            Reason(
                code=Code.CLAIMS_CONFLICT,
                message="each request fits alone, but not all together: "
                + ", ".join(
                    f"{p.request.name} of {p.claim.key} "
                    f"({p.request.count if p.request.mode == 'ExactCount' else 'all'})"
                    for p in plans
                ),
                subject=",".join(claims),
            )
        )
    return reasons


_READ = re.compile(r"device\s*\.\s*attributes\s*\[\s*['\"]([^'\"]+)['\"]\s*\]\s*\.\s*(\w+)")


def _values_read(expression: str, device: Device) -> str:
    """``: instanceType is "inf2.48xlarge"``: what the selector read on a device it rejects."""
    shown = []
    for domain, name in dict.fromkeys(_READ.findall(expression)):
        found = device.attribute(f"{domain}/{name}")
        value = "missing" if found is None else f"is {msgspec.json.encode(found[1]).decode()}"
        shown.append(f"{name} {value}")
    return f": {', '.join(shown[:3])} on {device.name}" if shown else ""


def _connection(plan: Plan, eligible: Sequence[Device], need: int) -> Reason | None:
    """For a request under matchAttribute: do enough eligible devices share one value."""
    for constraint in plan.claim.constraints:
        if not _applies(constraint, plan.request.name) or constraint.unsupported:
            continue
        groups: dict[str, list[str]] = {}
        for device in eligible:
            found = device.attribute(constraint.attribute)
            groups.setdefault("(none)" if found is None else str(found[1]), []).append(device.name)
        largest = max((len(v) for k, v in groups.items() if k != "(none)"), default=0)
        if largest < need:
            return Reason(
                code=Code.NOT_CONNECTED,
                message=f"{len(eligible)} devices are free for request {plan.request.name} of claim "
                f"{plan.claim.key}, but at most {largest} share {constraint.attribute} "
                f"(matchAttribute needs {need}): "
                + "; ".join(f"{value}: {len(names)}" for value, names in sorted(groups.items())),
                claim=plan.claim.key,
                request=plan.request.name,
                subject=constraint.attribute,
                details={
                    "attribute": constraint.attribute,
                    "groups": groups,
                    "need": need,
                    "largest": largest,
                },
            )
    return None
