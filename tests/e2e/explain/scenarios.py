"""The scenarios of the explain agreement test: each one a reason a pod can stay Pending
(or a case that must not be one), on the small fleet.

A scenario names the cluster state it needs (the hand-written pool on ``bare-trn2-0``, holder
claims, extra DeviceClasses, a cordon or a node taint), the claims of the pod to explain, and
the answer expected on each node: ``FITS`` or the reason code explain must give for that node.
The test checks that answer against the real kube-scheduler (one pinned copy of the pod per
node) and against explain, so a wrong expectation fails as loudly as a wrong explanation.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

T0, T1, INF, BARE = "trn2-48xl-0", "trn2-48xl-1", "inf2-48xl-0", "bare-trn2-0"
NODES = (T0, T1, INF, BARE)
CLASS = "neuron.aws.com"
FITS = "fits"
#: Reason codes that the node-level filters give, before any device is looked at.
NODE_LEVEL = {"NodeNotReady", "NodeUnschedulable", "NodeTaint", "NodeSelector"}
#: Reason codes that stay among a node's reasons whichever of its devices are free.
FREE_DEVICES_AGNOSTIC = NODE_LEVEL | {"RequestSelector", "ClassSelector"}
#: The label on every slice the test writes for ``bare-trn2-0``, so the next scenario can
#: remove them all.
BARE_LABEL = "test.neuron.aws.com/explain-pool"

TRN2 = "device.attributes['neuron.aws.com'].instanceType == 'trn2.48xlarge'"
HW_ERROR = "neuron.aws.com/hardware-error"

Json = dict[str, Any]
#: Builds the slices of ``bare-trn2-0`` from the devices of a publisher-written trn2 pool.
PoolBuilder = Callable[[list[Json]], list[Json]]


def request(
    name: str = "neurons",
    *,
    count: int | None = 1,
    cls: str = CLASS,
    selectors: tuple[str, ...] = (),
    all_devices: bool = False,
    tolerations: tuple[Json, ...] = (),
    admin: bool = False,
) -> Json:
    """One request of a claim, as a user writes it (resource.k8s.io/v1 ``exactly``)."""
    exactly: Json = {"deviceClassName": cls}
    if all_devices:
        exactly["allocationMode"] = "All"
    elif count is not None:
        exactly["count"] = count
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if tolerations:
        exactly["tolerations"] = list(tolerations)
    if admin:
        exactly["adminAccess"] = True
    return {"name": name, "exactly": exactly}


def claim_spec(*requests: Json, constraints: tuple[Json, ...] = ()) -> Json:
    devices: Json = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = list(constraints)
    return {"devices": devices}


@dataclass(frozen=True)
class Holder:
    """A pod pinned to ``node`` whose named claim takes devices before the scenario runs."""

    node: str
    spec: Json


@dataclass(frozen=True)
class Scenario:
    name: str
    #: What the scenario shows, for the failure message.
    about: str
    #: node -> FITS or the reason code explain gives for that node.
    expected: dict[str, str]
    #: The explained pod's claims, one ResourceClaimTemplate each (``c0``, ``c1``, ...).
    claims: tuple[Json, ...] = ()
    #: A claim the pod shares with a holder (by name) instead of a template.
    shared: str = ""
    pool: PoolBuilder | None = None
    holders: tuple[Holder, ...] = ()
    classes: tuple[Json, ...] = ()
    cordon: tuple[str, ...] = ()
    #: (node, taint) pairs in kubectl's ``key=value:Effect`` form.
    node_taints: tuple[tuple[str, str], ...] = ()
    node_selector: dict[str, str] = field(default_factory=dict)
    namespace_labels: dict[str, str] = field(default_factory=dict)
    #: The pod-level reason (every node refused before any node is looked at), if any.
    pod_level: str = ""

    @property
    def blocked(self) -> bool:
        """A selector error on any node stops every scheduling attempt of the pod."""
        return any(code == "SchedulerError" for code in self.expected.values())

    @property
    def schedulable(self) -> bool:
        return not self.blocked and any(code == FITS for code in self.expected.values())

    @property
    def world(self) -> tuple[object, ...]:
        """The cluster-wide state the scenario needs (scenarios with the same one may share
        it)."""
        classes = tuple(c["metadata"]["name"] for c in self.classes)
        return (self.pool, classes, self.cordon, self.node_taints)

    @property
    def light(self) -> bool:
        """Runs beside other light scenarios: no holders, and each of its pods holds at most
        one device per node, so it cannot change another one's answer. A scenario that fits
        nowhere holds nothing, but the devices its neighbours hold may change its reasons
        (DevicesHeld instead of ClaimsConflict): it runs beside others only when its reasons
        do not depend on which devices are free."""
        if self.holders or self.shared:
            return False
        if not any(code == FITS for code in self.expected.values()):
            return bool(self.pod_level) or set(self.expected.values()) <= FREE_DEVICES_AGNOSTIC
        wants = [
            r["exactly"].get("count", 0) if "count" in r["exactly"] else 99
            for spec in self.claims
            for r in spec["devices"]["requests"]
        ]
        return sum(wants) <= 1

    def top_code(self) -> str:
        """The code explain must put first: the pod-level one, the error, or else the code
        most nodes share (ties: the earlier node)."""
        if self.schedulable:
            return ""
        if self.pod_level:
            return self.pod_level
        if self.blocked:
            return "SchedulerError"
        codes = list(self.expected.values())
        return max(codes, key=codes.count)


def every(code: str) -> dict[str, str]:
    return dict.fromkeys(NODES, code)


def on(**codes: str) -> dict[str, str]:
    """FITS everywhere but the nodes named (t0, t1, inf, bare)."""
    names = {"t0": T0, "t1": T1, "inf": INF, "bare": BARE}
    out = every(FITS)
    out.update({names[k]: v for k, v in codes.items()})
    return out


# --- the hand-written pools of bare-trn2-0 -------------------------------------------------


def bare_slice(devices: list[Json], *, index: int = 0, count: int = 1, **extra: Any) -> Json:
    spec: Json = {
        "driver": "neuron.aws.com",
        "nodeName": BARE,
        "pool": {"name": BARE, "generation": 1, "resourceSliceCount": count},
        **extra,
    }
    if devices:
        spec["devices"] = devices
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{BARE}-explain-{index}", "labels": {BARE_LABEL: "true"}},
        "spec": spec,
    }


def trn2_copy(devices: list[Json]) -> list[Json]:
    """The publisher's trn2.48xlarge pool, copied onto the bare node."""
    return [bare_slice(copy.deepcopy(devices))]


def without_attribute(name: str) -> PoolBuilder:
    def build(devices: list[Json]) -> list[Json]:
        out = copy.deepcopy(devices)
        for d in out:
            d["attributes"].pop(name, None)
        return [bare_slice(out)]

    return build


def tainted(effect: str, ids: range = range(16)) -> PoolBuilder:
    def build(devices: list[Json]) -> list[Json]:
        out = copy.deepcopy(devices)
        for i in ids:
            out[i]["taints"] = [{"key": HW_ERROR, "value": "HBM", "effect": effect}]
        return [bare_slice(out)]

    return build


def with_version(version: str) -> PoolBuilder:
    def build(devices: list[Json]) -> list[Json]:
        out = copy.deepcopy(devices)
        for d in out:
            d["attributes"]["driverVersion"] = {"version": version}
        return [bare_slice(out)]

    return build


def incomplete(devices: list[Json]) -> list[Json]:
    """Slice 1 of 2 written, the other not yet: the pool is being updated."""
    return [bare_slice(copy.deepcopy(devices), count=2)]


def duplicated(devices: list[Json]) -> list[Json]:
    """Two slices of one pool that both list neurondevice0..7: an invalid pool."""
    first = copy.deepcopy(devices[:8])
    return [
        bare_slice(first, index=0, count=2),
        bare_slice(copy.deepcopy(first), index=1, count=2),
    ]


def ultraserver_node(devices: list[Json]) -> list[Json]:
    """A trn2u.48xlarge pool as the publisher writes it in counters mode: a counter slice
    (one counter per chip) and the chips plus the ``neuronnode`` device consuming all 16."""
    import tempfile
    from pathlib import Path

    from neuron_dra_common.hardware.node import read_node
    from neuron_dra_common.hardware.simulate import write_node
    from neuron_dra_slice_publisher.pool import NodeRef, render_slice
    from neuron_dra_slice_publisher.slices import NodeDeviceMode, build_pool

    with tempfile.TemporaryDirectory() as tmp:
        sim = write_node(Path(tmp), instance_type="trn2u.48xlarge", node_name=BARE)
        hardware = read_node(sim.root, neuron_ls_command=sim.neuron_ls_command)
    content = build_pool(
        node=BARE,
        hardware=hardware,
        labels={"node.kubernetes.io/instance-type": "trn2u.48xlarge"},
        mode=NodeDeviceMode.COUNTERS,
        dra_driver_version="0.1.0",
    )
    out = []
    for i, s in enumerate(content.slices):
        body = render_slice(
            s, owner=NodeRef(name=BARE, uid=""), index=i, generation=1, count=len(content.slices)
        )
        out.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{BARE}-explain-{i}", "labels": {BARE_LABEL: "true"}},
                "spec": body["spec"],
            }
        )
    return out


# --- holders ---------------------------------------------------------------------------------


def holding(node: str, count: int) -> Holder:
    return Holder(node, claim_spec(request(count=count)))


def holding_ids(node: str, ids: tuple[int, ...], *, kind: str = "neuron_device") -> Holder:
    """Devices by id, one request each (so the first device cannot fix the rest)."""
    reqs = [
        request(
            f"d{i}",
            selectors=(
                f"device.attributes['neuron.aws.com'].resourceType == '{kind}'"
                f" && device.attributes['neuron.aws.com'].deviceId == {i}",
            ),
        )
        for i in ids
    ]
    return Holder(node, claim_spec(*reqs))


HW_NOSCHEDULE = tainted("NoSchedule")
DRIVER_2_26 = with_version("2.26.0")
ROW_BREAKERS = holding_ids(T0, (0, 5, 10, 15))
T1_FULL = holding(T1, 16)
TOLERATE = ({"key": HW_ERROR, "operator": "Exists"},)
DEVICEGROUP4 = {"matchAttribute": "resource.aws.com/devicegroup4_id"}

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("baseline", "one device, no selector", every(FITS), (claim_spec(request()),)),
    Scenario(
        "instance-type",
        "a request selector on instanceType",
        on(inf="RequestSelector"),
        (claim_spec(request(selectors=(TRN2,))),),
    ),
    Scenario(
        "driver-version",
        "a driver version no node has",
        every("RequestSelector"),
        (
            claim_spec(
                request(
                    selectors=(
                        "device.attributes['neuron.aws.com'].neuronDriverVersion == '9.9.9.9'",
                    )
                )
            ),
        ),
    ),
    Scenario(
        "absorbed-error",
        "a missing attribute inside || true is no error",
        every(FITS),
        (
            claim_spec(
                request(selectors=("device.attributes['neuron.aws.com'].nope == 'x' || true",))
            ),
        ),
    ),
    Scenario(
        "other-domain",
        "has() on a domain no device has",
        every(FITS),
        (claim_spec(request(selectors=("!has(device.attributes['other.io'].x)",))),),
    ),
    Scenario(
        "capacity",
        "64 GiB of device memory (inf2 has 32)",
        on(inf="RequestSelector"),
        (
            claim_spec(
                request(
                    selectors=(
                        "device.capacity['neuron.aws.com'].memory.compareTo(quantity('64Gi')) >= 0",
                    )
                )
            ),
        ),
    ),
    Scenario(
        "node-selector",
        "the pod's own nodeSelector names trn2 nodes",
        on(inf="NodeSelector"),
        (claim_spec(request()),),
        node_selector={"node.kubernetes.io/instance-type": "trn2.48xlarge"},
    ),
    Scenario(
        "claims-conflict",
        "two claims, 12 and 6 devices: each fits alone, not together",
        every("ClaimsConflict"),
        (claim_spec(request(count=12)), claim_spec(request(count=6))),
    ),
    Scenario(
        "class-missing",
        "the request names a DeviceClass that does not exist",
        every("ClassMissing"),
        (claim_spec(request(cls="nope")),),
        pod_level="ClassMissing",
    ),
    Scenario(
        "count",
        "13 devices: more than an inf2.48xlarge has",
        on(inf="NotEnoughDevices"),
        (claim_spec(request(count=13)),),
    ),
    Scenario(
        "class-selector",
        "a second DeviceClass that keeps inf2 devices only",
        on(t0="ClassSelector", t1="ClassSelector", bare="ClassSelector"),
        (claim_spec(request(cls="inf-only")),),
        classes=(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "inf-only"},
                "spec": {
                    "selectors": [
                        {
                            "cel": {
                                "expression": "device.attributes['neuron.aws.com']"
                                ".instanceType.startsWith('inf2')"
                            }
                        }
                    ]
                },
            },
        ),
    ),
    Scenario(
        "connected",
        "4 connected devices after a holder took one device of every torus row of T0",
        on(t0="NotConnected", inf="NotConnected"),
        (claim_spec(request(count=4), constraints=(DEVICEGROUP4,)),),
        holders=(ROW_BREAKERS,),
    ),
    Scenario(
        "two-requests",
        "one matchAttribute over two requests of 2, one device of every row of T0 held",
        # Each request alone finds 2 devices of one row; the constraint over both needs 4
        # in one row: explain says the requests are not connected together.
        on(t0="NotConnected"),
        (
            claim_spec(
                request("a", count=2),
                request("b", count=2),
                constraints=(
                    {"matchAttribute": "neuron.aws.com/topology4_id", "requests": ["a", "b"]},
                ),
            ),
        ),
        holders=(ROW_BREAKERS,),
    ),
    Scenario(
        "held",
        "every device of T1 held by another claim",
        on(t1="DevicesHeld"),
        (claim_spec(request()),),
        holders=(T1_FULL,),
    ),
    Scenario(
        "selector-and-held",
        "instanceType selector, and T1 full",
        on(t1="DevicesHeld", inf="RequestSelector"),
        (claim_spec(request(selectors=(TRN2,))),),
        holders=(T1_FULL,),
    ),
    Scenario(
        "all-devices",
        "allocationMode All with the instanceType selector; one device of T1 held",
        on(t1="DevicesHeld", inf="RequestSelector"),
        (claim_spec(request(count=None, all_devices=True, selectors=(TRN2,))),),
        holders=(holding(T1, 1),),
    ),
    Scenario(
        "admin-access",
        "adminAccess reaches devices other claims hold",
        every(FITS),
        (claim_spec(request(admin=True)),),
        holders=(T1_FULL,),
        namespace_labels={"resource.kubernetes.io/admin-access": "true"},
    ),
    Scenario(
        "tainted",
        "every device of the bare node tainted NoSchedule",
        on(bare="DeviceTainted"),
        (claim_spec(request()),),
        pool=HW_NOSCHEDULE,
    ),
    Scenario(
        "tolerated",
        "the same taint, tolerated by the request",
        every(FITS),
        (claim_spec(request(tolerations=TOLERATE)),),
        pool=HW_NOSCHEDULE,
    ),
    Scenario(
        "taint-none",
        "a taint with effect None does not block",
        every(FITS),
        (claim_spec(request()),),
        pool=tainted("None"),
    ),
    Scenario(
        "tainted-and-held",
        "half the bare node's devices tainted NoExecute, the other half held",
        on(bare="DeviceTainted"),
        (claim_spec(request()),),
        pool=tainted("NoExecute", range(8)),
        holders=(holding(BARE, 8),),
    ),
    Scenario(
        "missing-attribute",
        "a selector reading an attribute the bare node's devices lack",
        on(inf="RequestSelector", bare="SchedulerError"),
        (claim_spec(request(selectors=(TRN2,))),),
        pool=without_attribute("instanceType"),
    ),
    Scenario(
        "semver",
        "a version attribute compared as semver, guarded by has()",
        on(t0="RequestSelector", t1="RequestSelector", inf="RequestSelector"),
        (
            claim_spec(
                request(
                    selectors=(
                        "has(device.attributes['neuron.aws.com'].driverVersion) && "
                        "device.attributes['neuron.aws.com'].driverVersion"
                        ".isGreaterThan(semver('2.25.0'))",
                    )
                )
            ),
        ),
        pool=DRIVER_2_26,
    ),
    Scenario(
        "semver-unguarded",
        "the same without has(): the nodes without the attribute are errors",
        on(t0="SchedulerError", t1="SchedulerError", inf="SchedulerError"),
        (
            claim_spec(
                request(
                    selectors=(
                        "device.attributes['neuron.aws.com'].driverVersion"
                        ".isGreaterThan(semver('2.25.0'))",
                    )
                )
            ),
        ),
        pool=DRIVER_2_26,
    ),
    Scenario(
        "counters",
        "the UltraServer node device when a holder took chip 3 (shared counters)",
        on(
            t0="RequestSelector",
            t1="RequestSelector",
            inf="RequestSelector",
            bare="CounterSpent",
        ),
        (
            claim_spec(
                request(
                    selectors=("device.attributes['neuron.aws.com'].resourceType == 'neuron_node'",)
                )
            ),
        ),
        pool=ultraserver_node,
        holders=(holding_ids(BARE, (3,)),),
    ),
    Scenario(
        "incomplete-pool",
        "the bare node's pool has 1 of its 2 slices",
        on(bare="PoolIncomplete"),
        (claim_spec(request()),),
        pool=incomplete,
    ),
    Scenario(
        "invalid-pool",
        "the bare node's pool lists the same devices in two slices",
        on(bare="PoolInvalid"),
        (claim_spec(request()),),
        pool=duplicated,
    ),
    Scenario(
        "shared-claim",
        "a claim shared with a pod on T0, already allocated there",
        on(t1="ClaimOnOtherNode", inf="ClaimOnOtherNode", bare="ClaimOnOtherNode"),
        shared="hold-0",
        holders=(holding(T0, 1),),
    ),
    Scenario(
        "cordon",
        "T1 cordoned, and the instanceType selector",
        on(t1="NodeUnschedulable", inf="RequestSelector"),
        (claim_spec(request(selectors=(TRN2,))),),
        cordon=(T1,),
    ),
    Scenario(
        "node-taint",
        "an untolerated taint on the inf2 node",
        on(inf="NodeTaint"),
        (claim_spec(request()),),
        node_taints=((INF, "example.com/maintenance=yes:NoSchedule"),),
    ),
)
