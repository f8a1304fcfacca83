"""``neuron-dra explain`` agrees with the real kube-scheduler, node by node, on 30 scenarios:
every reason code the product's pools can produce (selectors, classes, held devices, device
and node taints, connectivity, counters, pools being updated or invalid, shared claims,
cordons, CEL errors that stop the scheduler), mixes of them, and cases that must fit.

For each scenario the pod is created unpinned, held back by a scheduling gate until explain
has judged it from the cluster as listed; then the scheduler places it (or not), and one copy
per node, pinned with ``nodeSelector``, gives the scheduler's answer for that node. The hand-written expectation of each scenario is
checked against the scheduler too, so a wrong expectation cannot pass quietly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from neuron_dra_common.explain import Explanation, Snapshot, explain_pod

from tests.e2e.explain.oracle import Observed, Oracle
from tests.e2e.explain.scenarios import FITS, NODE_LEVEL, NODES, SCENARIOS, Scenario
from tests.fixtures.stack import KubeStack

pytestmark = pytest.mark.stack

#: Scenarios whose explanation is also asked of the CLI as a user asks it (-o json), while
#: the pod is Pending.
BY_CLI = {"selector-and-held", "counters", "missing-attribute"}
#: Codes the scheduler does not count as "cannot allocate all claims" in its message.
OWN_MESSAGE = NODE_LEVEL | {"ClaimOnOtherNode", "PoolInvalid", "ClassMissing"}


def verdict_of(code: str) -> str:
    if code == FITS:
        return "fits"
    return "scheduler-error" if code == "SchedulerError" else "does-not-fit"


@pytest.fixture(scope="module")
def observed(kube_stack: KubeStack) -> Iterator[dict[str, Observed]]:
    """Every scenario, run once on the shared stack; its objects are gone afterwards."""
    kube_stack.kubectl("apply", "-f", "deploy/kustomize/base/core/deviceclass.yaml", check=False)
    oracle = Oracle(kube_stack, by_cli=BY_CLI)
    try:
        yield oracle.run([(sc, f"explain-{sc.name}") for sc in SCENARIOS])
    finally:
        oracle.close()


def explain(obs: Observed, scenario: Scenario) -> Explanation:
    got = obs.snapshot
    snap = Snapshot.build(
        pods=got["pods"],
        nodes=got["nodes"],
        slices=got["slices"],
        claims=got["claims"],
        classes=got["classes"],
        templates=got["templates"],
    )
    return explain_pod(snap, namespace=f"explain-{scenario.name}", name="p")


def codes_on(exp: Explanation, node: str) -> set[str]:
    entry = exp.nodes.get(node)
    found = {r.code for r in exp.pod_level}
    if entry is not None:
        found |= {r.code for r in exp.groups[entry.group].reasons}
    return found


def test_scenarios_cover_twenty_reasons() -> None:
    kinds = {tuple(sorted(set(sc.expected.values()))) for sc in SCENARIOS}
    codes = {c for sc in SCENARIOS for c in sc.expected.values()} - {FITS}
    assert len(SCENARIOS) >= 20
    assert len(kinds) >= 20, kinds
    assert len(codes) >= 15, codes


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda sc: sc.name)
def test_scheduler_answers_as_expected(observed: dict[str, Observed], scenario: Scenario) -> None:
    """The expectation written in the scenario is what the scheduler does."""
    obs = observed[scenario.name]
    got = {node: o.verdict for node, o in obs.pinned.items()}
    want = {node: verdict_of(code) for node, code in scenario.expected.items()}
    assert got == want, f"{scenario.about}: {[(n, o.message) for n, o in obs.pinned.items()]}"
    assert (obs.unpinned.verdict == "fits") == scenario.schedulable, obs.unpinned
    if scenario.blocked:
        assert obs.unpinned.verdict == "scheduler-error", obs.unpinned
    if obs.unpinned.verdict == "does-not-fit" and not scenario.pod_level:
        # The FailedScheduling histogram counts the nodes whose devices do not fit.
        n = sum(1 for c in scenario.expected.values() if c not in OWN_MESSAGE)
        assert f"{n} cannot allocate all claims" in obs.unpinned.message, obs.unpinned.message


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda sc: sc.name)
def test_explain_agrees_with_scheduler(observed: dict[str, Observed], scenario: Scenario) -> None:
    """Explain's verdict for the unpinned pod, on every node, is the scheduler's answer for
    that node, and explain names the scenario's reason on it."""
    obs = observed[scenario.name]
    exp = explain(obs, scenario)
    for node in NODES:
        entry = exp.nodes.get(node)
        verdict = entry.verdict if entry is not None else "does-not-fit"
        if entry is None:
            assert exp.pod_level, f"{node} missing from explain's answer without a pod-level reason"
        assert verdict == obs.pinned[node].verdict, (
            f"{scenario.name} ({scenario.about}) on {node}: explain says {verdict}, the "
            f"scheduler {obs.pinned[node].verdict} ({obs.pinned[node].message})"
        )
        code = scenario.expected[node]
        if code != FITS:
            assert code in codes_on(exp, node), (
                f"{scenario.name} on {node}: {code} not among {codes_on(exp, node)}: "
                f"{[r.message for r in exp.pod_level]} "
                f"{[r.message for r in exp.groups[entry.group].reasons] if entry else []}"
            )
    assert exp.summary.schedulable == (obs.unpinned.verdict == "fits")
    if scenario.schedulable:
        assert exp.top_code() == ""
    elif scenario.pod_level or scenario.blocked or len(set(scenario.expected.values())) == 1:
        assert exp.top_code() == scenario.top_code()
    else:
        assert exp.top_code() in set(scenario.expected.values())
    message = exp.event_message()
    assert len(message.encode()) <= 1024
    if exp.top_code():
        assert message.startswith(exp.top_code()), message
    if scenario.blocked:
        # The scheduler's own error text (claim name aside) is what explain shows.
        error = re.sub(r"claim \S+: ", "", obs.unpinned.message.split("filter plugin: ")[-1])
        assert exp.summary.blocked_by is not None
        assert error in exp.summary.blocked_by.message, exp.summary.blocked_by


@pytest.mark.parametrize("name", sorted(BY_CLI))
def test_cli_json_gives_the_same_verdicts(observed: dict[str, Observed], name: str) -> None:
    """``neuron-dra explain pod/p -o json``, run while the pod was Pending, as a user runs it,
    gives the same verdicts."""
    obs = observed[name]
    assert obs.cli is not None
    doc = json.loads(obs.cli)
    assert doc["apiVersion"] == "explain.neuron.aws.com/v1"
    assert {n: e["verdict"] for n, e in doc["nodes"].items()} == {
        n: o.verdict for n, o in obs.pinned.items()
    }
