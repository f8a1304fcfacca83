"""Why a node has no solution (pure): per request, which check removed each device, in the
allocator's order (held, class selector, request selector, counters, device taints), then
whether a ``matchAttribute`` constraint or the requests together are what fails."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from fractions import Fraction

import msgspec

from neuron_dra_common.explain.celenv import CannotEvaluate, DraCel
from neuron_dra_common.explain.model import Device, DeviceId, Pool
from neuron_dra_common.explain.reasons import Code
from neuron_dra_common.explain.result import Reason
from neuron_dra_common.explain.search import (
    Allocated,
    Plan,
    Search,
    applies,
    selector_answer,
    untolerated,
)

__all__ = ["why_not"]


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
    search = Search(cel, plans, pools, allocated, taints=taints, counters=counters)
    if not search.devices:
        if not pools:
            reasons.append(
                Reason(code=Code.NO_POOL, message="no ResourceSlice offers devices to this node")
            )
        return reasons
    fits_alone = True
    #: the requests that fit alone: their eligible devices and how many each needs
    alone: list[tuple[Plan, list[Device], int]] = []
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
        alone.append((plan, tally.eligible, need))
        connected = _connection(plan, tally.eligible, need)
        if connected is not None:
            fits_alone = False
            reasons.append(connected)
    if fits_alone:
        joint = _joint_connection(alone)
        if joint is not None:
            fits_alone = False
            reasons.append(joint)
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
        if not applies(constraint, plan.request.name) or constraint.unsupported:
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


def _joint_connection(alone: Sequence[tuple[Plan, list[Device], int]]) -> Reason | None:
    """For a matchAttribute over several requests of a claim, each connected alone: is there
    one value that enough free devices of every request share, and enough of them in all
    (for the requests' total)? If not, that is why the node fails, not the claims together."""
    for plan, _, _ in alone:
        for constraint in plan.claim.constraints:
            if constraint.unsupported:
                continue
            members = [
                (p, eligible, need)
                for p, eligible, need in alone
                if p.claim.key == plan.claim.key and applies(constraint, p.request.name)
            ]
            if len(members) < 2 or members[0][0] is not plan:
                continue  # one request alone is _connection's; each claim is asked once
            total = sum(need for _, _, need in members)
            per_value: dict[str, list[set[str]]] = {}
            for index, (_, eligible, _) in enumerate(members):
                for device in eligible:
                    found = device.attribute(constraint.attribute)
                    if found is None:
                        continue
                    sets = per_value.setdefault(str(found[1]), [set() for _ in members])
                    sets[index].add(device.name)
            best = 0
            for sets in per_value.values():
                each = all(len(names) >= m[2] for names, m in zip(sets, members, strict=True))
                together = len(set().union(*sets))
                if each and together >= total:
                    break
                # What the requests could take at this value, each up to its need.
                usable = sum(min(len(n), m[2]) for n, m in zip(sets, members, strict=True))
                best = max(best, min(together, usable))
            else:
                requests = ", ".join(p.request.name for p, _, _ in members)
                return Reason(
                    code=Code.NOT_CONNECTED,
                    message=f"requests {requests} of claim {plan.claim.key} need {total} devices "
                    f"that share {constraint.attribute} (matchAttribute); each request has "
                    f"enough free devices alone, but at most {best} free devices share one "
                    "value among them",
                    claim=plan.claim.key,
                    request=requests,
                    subject=constraint.attribute,
                    details={"attribute": constraint.attribute, "need": total, "largest": best},
                )
    return None
