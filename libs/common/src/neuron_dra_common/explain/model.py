"""The API objects explain reads, reduced to what the scheduler's checks use (pure).

Built from raw ``resource.k8s.io/v1`` and ``v1`` objects (dicts as the API's JSON decodes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

import msgspec

from neuron_dra_common.explain.celenv import DeviceValue, device_value
from neuron_dra_common.explain.celtypes import parse_quantity

__all__ = [
    "Claim",
    "Constraint",
    "Device",
    "DeviceClass",
    "DeviceId",
    "NodeFacts",
    "Pool",
    "Request",
    "Selector",
    "claim_from",
    "class_from",
    "node_from",
    "pools_from",
]

Obj = Mapping[str, Any]
DeviceId = tuple[str, str, str]  # driver, pool, device


class Selector(msgspec.Struct, frozen=True):
    expression: str
    source: str  # "class neuron.aws.com" or "claim ns/name"
    index: int


class DeviceClass(msgspec.Struct, frozen=True):
    name: str
    selectors: tuple[Selector, ...]


class Request(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    class_name: str
    mode: str  # ExactCount | All
    count: int
    selectors: tuple[Selector, ...]
    admin_access: bool = False
    tolerations: tuple[Obj, ...] = ()
    unsupported: str = ""  # a feature explain does not evaluate (firstAvailable, capacity)


class Constraint(msgspec.Struct, frozen=True):
    attribute: str
    requests: tuple[str, ...]  # empty: every request of the claim
    unsupported: str = ""


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    namespace: str
    name: str
    uid: str
    requests: tuple[Request, ...]
    constraints: tuple[Constraint, ...]
    allocated: tuple[DeviceId, ...] = ()
    is_allocated: bool = False
    allocation_node_selector: Obj | None = None
    reserved_for: tuple[str, ...] = ()  # pod UIDs
    deleting: bool = False
    owner_uids: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class Device(msgspec.Struct, kw_only=True):
    id: DeviceId
    name: str
    raw: Obj
    taints: tuple[Obj, ...]
    consumes: tuple[tuple[str, dict[str, Fraction]], ...]
    unsupported: str = ""
    _value: DeviceValue | None = None

    @property
    def value(self) -> DeviceValue:
        # Built on first use: a device nobody selects on is never converted.
        if self._value is None:
            self._value = device_value(driver=self.id[0], device=self.raw)
        return self._value

    def attribute(self, qualified: str) -> tuple[str, Any] | None:
        """A typed attribute value, looked up as matchAttribute does (driver's domain may be
        left out of the device's names)."""
        attrs = self.raw.get("attributes") or {}
        raw = attrs.get(qualified)
        domain, _, ident = qualified.rpartition("/")
        if raw is None and domain == self.id[0]:
            raw = attrs.get(ident)
        if not raw:
            return None
        kind, value = next(iter(raw.items()))
        return kind, value


class Pool(msgspec.Struct, kw_only=True):
    driver: str
    name: str
    node_name: str
    all_nodes: bool
    node_selector: Obj | None
    generation: int
    slice_count: int
    slices_seen: int
    devices: list[Device]
    counters: dict[str, dict[str, Fraction]]
    invalid: str = ""
    unsupported: str = ""

    @property
    def complete(self) -> bool:
        return self.slices_seen == self.slice_count


class NodeFacts(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    labels: dict[str, str]
    taints: tuple[Obj, ...]
    unschedulable: bool
    ready: bool


def node_from(obj: Obj) -> NodeFacts:
    status = obj.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
    spec = obj.get("spec") or {}
    return NodeFacts(
        name=obj["metadata"]["name"],
        labels=dict(obj["metadata"].get("labels") or {}),
        taints=tuple(spec.get("taints") or ()),
        unschedulable=bool(spec.get("unschedulable")),
        ready=ready,
    )


def class_from(obj: Obj) -> DeviceClass:
    name = obj["metadata"]["name"]
    return DeviceClass(name=name, selectors=_selectors(obj.get("spec") or {}, f"class {name}"))


def _selectors(spec: Obj, source: str) -> tuple[Selector, ...]:
    out = []
    for index, selector in enumerate(spec.get("selectors") or ()):
        expression = (selector.get("cel") or {}).get("expression", "")
        out.append(Selector(expression=expression, source=source, index=index))
    return tuple(out)


def _request(raw: Obj, claim_key: str) -> Request:
    name = raw.get("name", "")
    if "firstAvailable" in raw:
        return Request(
            name=name,
            class_name="",
            mode="ExactCount",
            count=0,
            selectors=(),
            unsupported="firstAvailable (prioritized list) requests",
        )
    exact = raw.get("exactly") or raw  # v1 nests the request under `exactly`
    mode = exact.get("allocationMode") or "ExactCount"
    unsupported = ""
    if exact.get("capacity"):
        unsupported = "capacity requests (consumable capacity)"
    return Request(
        name=name,
        class_name=exact.get("deviceClassName", ""),
        mode=mode,
        count=int(exact.get("count") or 1) if mode == "ExactCount" else 0,
        selectors=_selectors(exact, f"claim {claim_key}"),
        admin_access=bool(exact.get("adminAccess")),
        tolerations=tuple(exact.get("tolerations") or ()),
        unsupported=unsupported,
    )


def claim_from(obj: Obj) -> Claim:
    meta = obj["metadata"]
    key = f"{meta.get('namespace', '')}/{meta['name']}"
    devices = (obj.get("spec") or {}).get("devices") or {}
    constraints = []
    for raw in devices.get("constraints") or ():
        if "matchAttribute" in raw:
            constraints.append(
                Constraint(
                    attribute=raw["matchAttribute"], requests=tuple(raw.get("requests") or ())
                )
            )
        else:
            kind = next(iter(k for k in raw if k != "requests"), "unknown")
            constraints.append(
                Constraint(attribute="", requests=(), unsupported=f"{kind} constraints")
            )
    status = obj.get("status") or {}
    allocation = status.get("allocation")
    allocated: list[DeviceId] = []
    for result in ((allocation or {}).get("devices") or {}).get("results") or ():
        device_id = (result["driver"], result["pool"], result["device"])
        if not result.get("adminAccess"):
            # An admin-access result does not hold its device (the scheduler's AllocatedState).
            allocated.append(device_id)
    return Claim(
        namespace=meta.get("namespace", ""),
        name=meta["name"],
        uid=meta.get("uid", ""),
        requests=tuple(_request(r, key) for r in devices.get("requests") or ()),
        constraints=tuple(constraints),
        allocated=tuple(allocated),
        is_allocated=allocation is not None,
        allocation_node_selector=(allocation or {}).get("nodeSelector"),
        reserved_for=tuple(r.get("uid", "") for r in status.get("reservedFor") or ()),
        deleting=bool(meta.get("deletionTimestamp")),
        owner_uids=tuple(o.get("uid", "") for o in meta.get("ownerReferences") or ()),
    )


def pools_from(slices: Iterable[Obj]) -> list[Pool]:
    """Pools as the scheduler sees them: only the newest generation's slices, completeness
    by ``resourceSliceCount``, and invalid when a device name repeats."""
    newest: dict[tuple[str, str], list[Obj]] = {}
    for obj in slices:
        spec = obj.get("spec") or {}
        key = (spec.get("driver", ""), (spec.get("pool") or {}).get("name", ""))
        group = newest.setdefault(key, [])
        generation = int((spec.get("pool") or {}).get("generation") or 0)
        if group and int(group[0]["spec"]["pool"].get("generation") or 0) < generation:
            group.clear()
        if not group or int(group[0]["spec"]["pool"].get("generation") or 0) == generation:
            group.append(obj)
    pools = []
    for (driver, name), group in sorted(newest.items()):
        pools.append(_pool(driver, name, sorted(group, key=lambda o: o["metadata"]["name"])))
    return pools


def _pool(driver: str, name: str, slices: Sequence[Obj]) -> Pool:
    first = slices[0]["spec"]
    pool = Pool(
        driver=driver,
        name=name,
        node_name=first.get("nodeName") or "",
        all_nodes=bool(first.get("allNodes")),
        node_selector=first.get("nodeSelector"),
        generation=int(first["pool"].get("generation") or 0),
        slice_count=int(first["pool"].get("resourceSliceCount") or 1),
        slices_seen=len(slices),
        devices=[],
        counters={},
    )
    seen: set[str] = set()
    for obj in slices:
        spec = obj["spec"]
        if spec.get("perDeviceNodeSelection"):
            pool.unsupported = "per-device node selection"
        for counter_set in spec.get("sharedCounters") or ():
            pool.counters[counter_set["name"]] = {
                counter: parse_quantity(str(value.get("value", "0")))
                for counter, value in (counter_set.get("counters") or {}).items()
            }
        for raw in spec.get("devices") or ():
            device_name = raw["name"]
            if device_name in seen:
                pool.invalid = f"device {device_name} is listed twice"
            seen.add(device_name)
            pool.devices.append(_device(driver, name, raw))
    return pool


def _device(driver: str, pool: str, raw: Obj) -> Device:
    unsupported = ""
    if raw.get("allowMultipleAllocations"):
        unsupported = "devices that allow multiple allocations (consumable capacity)"
    elif raw.get("bindingConditions"):
        unsupported = "devices with binding conditions"
    consumes = tuple(
        (
            c["counterSet"],
            {
                k: parse_quantity(str(v.get("value", "0")))
                for k, v in (c.get("counters") or {}).items()
            },
        )
        for c in raw.get("consumesCounters") or ()
    )
    return Device(
        id=(driver, pool, raw["name"]),
        name=raw["name"],
        raw=raw,
        taints=tuple(raw.get("taints") or ()),
        consumes=consumes,
        unsupported=unsupported,
    )
