"""The kubelet version check: which versions have the DRA regression of kubernetes#133920, and
what the check writes (its Event, the NeuronHealth condition beside the health probe's) and
refuses. The API here is an in-memory Node; tests/e2e/kubeletcheck runs it on real kubelets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from neuron_dra_kubelet_plugin.checkpoint import PreparedDevice
from neuron_dra_kubelet_plugin.claims import ClaimRef, claim_from_api
from neuron_dra_kubelet_plugin.kubeletcheck import (
    REASON,
    KubeletCheck,
    KubeletGate,
    has_dra_regression,
    parse_kubelet_version,
    verdict_for,
)
from neuron_dra_kubelet_plugin.plan import PrepareError

from tests.unit.kubelet_plugin.support import claim_json

REF = ClaimRef(namespace="default", name="c", uid="u1")


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("v1.34.1", (1, 34, 1)),
        ("1.34.1", (1, 34, 1)),
        ("v1.34.1-eks-113cf36", (1, 34, 1)),
        ("v1.34.2-eks-b707fbb", (1, 34, 2)),
        ("v1.34.1+k3s1", (1, 34, 1)),
        ("v1.34.0-rc.2", (1, 34, 0)),
        (" v1.35.0 ", (1, 35, 0)),
        ("v1.100.12", (1, 100, 12)),
    ],
)
def test_versions_parse_with_vendor_suffixes(text: str, parsed: tuple[int, int, int]) -> None:
    assert parse_kubelet_version(text) == parsed


@pytest.mark.parametrize("text", ["", "v1.34", "1.34.x", "kubelet 1.34.1", "v1.34.1 eks", "v1..1"])
def test_a_version_that_is_not_one_is_refused_naming_the_field(text: str) -> None:
    with pytest.raises(ValueError, match=r"status\.nodeInfo\.kubeletVersion"):
        parse_kubelet_version(text)


@pytest.mark.parametrize(
    ("text", "affected"),
    [
        ("v1.34.0", True),
        ("v1.34.0-rc.1", True),
        ("v1.34.1", True),
        ("v1.34.1-eks-113cf36", True),
        ("v1.34.2", False),
        ("v1.34.2-eks-b707fbb", False),
        ("v1.34.4", False),
        ("v1.33.5", False),
        ("v1.33.1-eks-1", False),
        ("v1.35.0", False),
        ("v1.36.3", False),
        ("v2.34.1", False),
    ],
)
def test_only_1_34_0_and_1_34_1_have_the_regression(text: str, affected: bool) -> None:
    assert has_dra_regression(parse_kubelet_version(text)) is affected


def test_the_refusal_says_what_why_and_how_out() -> None:
    verdict = verdict_for("n1", "v1.34.1-eks-113cf36", allow=False)
    assert not verdict.serves
    text = verdict.refusal()
    for part in (
        "node n1",
        "kubelet v1.34.1-eks-113cf36",
        "kubernetes#133920",
        "idle for 30 minutes",
        "v1.34.2",
        "NEURON_DRA_ALLOW_KUBELET_DRA_REGRESSION=true",
    ):
        assert part in text
    allowed = verdict_for("n1", "v1.34.1", allow=True)
    assert allowed.serves
    assert "prepared anyway" in allowed.message()
    assert verdict_for("n1", "v1.34.2", allow=False).serves


class MemoryNode:
    """One Node as the API serves it: get, a strategic merge of conditions, Events."""

    def __init__(self, version: str, conditions: list[dict[str, Any]] | None = None) -> None:
        self.version = version
        self.conditions = conditions or []
        self.events: list[dict[str, Any]] = []
        self.patches = 0
        self.fail_gets = False

    async def get(self, resource: Any, name: str) -> dict[str, Any]:
        if self.fail_gets:
            raise ConnectionError("apiserver away")
        return {
            "metadata": {"name": name, "uid": "node-uid"},
            "status": {
                "nodeInfo": {"kubeletVersion": self.version},
                "conditions": [dict(c) for c in self.conditions],
            },
        }

    async def patch_status(self, resource: Any, name: str, patch: Any, *, kind: Any = "") -> Any:
        assert kind == "strategic"
        self.patches += 1
        for item in patch["status"]["conditions"]:
            self.conditions = [c for c in self.conditions if c["type"] != item["type"]] + [item]
        return {}

    async def post_event(
        self,
        involved: Mapping[str, str],
        *,
        reason: str,
        message: str,
        component: str,
        warning: bool = False,
        host: str = "",
    ) -> Any:
        self.events.append({"involved": dict(involved), "reason": reason, "message": message})
        return {}

    def condition(self) -> tuple[str, str]:
        (c,) = [c for c in self.conditions if c["type"] == "NeuronHealth"]
        return c["status"], c["reason"]


class Inner:
    def __init__(self) -> None:
        self.prepared: list[str] = []
        self.unprepared: list[str] = []

    async def prepare(self, ref: ClaimRef) -> tuple[PreparedDevice, ...]:
        self.prepared.append(ref.uid)
        return ()

    async def unprepare(self, ref: ClaimRef) -> None:
        self.unprepared.append(ref.uid)


async def test_an_affected_kubelet_gets_one_event_the_condition_and_refused_claims() -> None:
    node = MemoryNode("v1.34.1-eks-113cf36")
    check = KubeletCheck(node, node="n1", allow=False)
    inner = Inner()
    gate = KubeletGate(inner, check)
    with pytest.raises(PrepareError, match="kubernetes#133920"):
        await gate.prepare(REF)  # checks first when no check has run yet
    await check.check()
    await check.check()
    assert [e["reason"] for e in node.events] == [REASON]  # once per version
    assert node.events[0]["involved"]["kind"] == "Node"
    assert node.condition() == ("True", REASON)
    assert node.patches == 1  # unchanged since
    await gate.unprepare(REF)
    assert inner.prepared == []
    assert inner.unprepared == ["u1"]


class Claims:
    def __init__(self) -> None:
        self.reads = 0

    async def get(self, ref: ClaimRef) -> Any:
        self.reads += 1
        return claim_from_api(claim_json(ref.uid, [0]))


class Reporter:
    def __init__(self) -> None:
        self.told: list[tuple[str, str]] = []

    def failed(self, claim: Any, message: str) -> None:
        self.told.append((claim.metadata.uid, message))


async def test_a_refused_claim_is_told_to_the_reporter_once() -> None:
    node = MemoryNode("v1.34.1")
    claims, reporter = Claims(), Reporter()
    gate = KubeletGate(
        Inner(), KubeletCheck(node, node="n1", allow=False), claims=claims, reporter=reporter
    )
    for _ in range(3):  # the kubelet retries
        with pytest.raises(PrepareError):
            await gate.prepare(REF)
    assert claims.reads == 1
    ((uid, message),) = reporter.told
    assert uid == "u1"
    assert "kubernetes#133920" in message


async def test_the_setting_serves_an_affected_kubelet_and_still_warns() -> None:
    node = MemoryNode("v1.34.0")
    check = KubeletCheck(node, node="n1", allow=True)
    inner = Inner()
    await KubeletGate(inner, check).prepare(REF)
    assert inner.prepared == ["u1"]
    assert node.condition() == ("True", REASON)
    assert "prepared anyway" in node.events[0]["message"]


async def test_a_fixed_kubelet_is_served_with_no_event_and_no_condition() -> None:
    node = MemoryNode("v1.34.2")
    check = KubeletCheck(node, node="n1", allow=False)
    inner = Inner()
    await KubeletGate(inner, check).prepare(REF)
    assert inner.prepared == ["u1"]
    assert node.events == []
    assert node.conditions == []


async def test_a_device_error_of_the_health_probe_is_never_overwritten() -> None:
    sram = {"type": "NeuronHealth", "status": "True", "reason": "NeuronHasError_SRAM"}
    node = MemoryNode("v1.34.1", [sram])
    check = KubeletCheck(node, node="n1", allow=False)
    await check.check()
    assert node.condition() == ("True", "NeuronHasError_SRAM")
    assert [e["reason"] for e in node.events] == [REASON]  # the Event still tells
    # The probe reports no error again: the kubelet's problem comes back at the next check.
    node.conditions = [{"type": "NeuronHealth", "status": "False", "reason": "NeuronHasNoError"}]
    await check.check()
    assert node.condition() == ("True", REASON)


async def test_an_upgraded_kubelet_is_served_and_the_condition_cleared() -> None:
    node = MemoryNode("v1.34.1")
    check = KubeletCheck(node, node="n1", allow=False)
    gate = KubeletGate(Inner(), check)
    await check.check()
    node.version = "v1.34.2"
    await check.check()
    assert node.condition() == ("False", "NeuronHasNoError")
    await gate.prepare(REF)


async def test_an_unreadable_version_is_not_held_against_the_node() -> None:
    node = MemoryNode("unknown")
    check = KubeletCheck(node, node="n1", allow=False)
    verdict = await check.check()
    assert verdict.serves
    assert node.events == []


async def test_a_first_claim_with_no_api_fails_clearly() -> None:
    node = MemoryNode("v1.34.2")
    node.fail_gets = True
    with pytest.raises(PrepareError, match="kubelet version of this node could not be read"):
        await KubeletGate(Inner(), KubeletCheck(node, node="n1", allow=False)).prepare(REF)


async def test_the_health_probe_leaves_the_kubelet_warning_but_writes_a_device_error() -> None:
    from datetime import UTC, datetime

    from neuron_dra_health_monitor.probe_node import ConditionWriter

    node = MemoryNode("v1.34.1")
    await KubeletCheck(node, node="n1", allow=False).check()
    types = frozenset({"NeuronHealth", "AcceleratedHardwareReady"})
    writer = ConditionWriter(node, node="n1", types=types)  # type: ignore[arg-type]
    healthy = {
        "NeuronHealth": ("False", "NeuronHasNoError", "none"),
        "AcceleratedHardwareReady": ("True", "NeuronHasNoError", "none"),
    }
    assert await writer.write(healthy, now=datetime.now(UTC))
    assert node.condition() == ("True", REASON)
    ready = [c for c in node.conditions if c["type"] == "AcceleratedHardwareReady"]
    assert ready[0]["status"] == "True"  # its other condition is written as before
    faulty = {"NeuronHealth": ("True", "NeuronHasError_SRAM", "neurondevice3: SRAM")}
    assert await writer.write(faulty, now=datetime.now(UTC))
    assert node.condition() == ("True", "NeuronHasError_SRAM")
