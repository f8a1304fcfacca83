"""`neuron-dra dev ...` as a user drives it: up, status, kubeconfig, down."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.stack import neuron_dra, start_stack, stop_stack

TINY_FLEET = "nodes:\n  - instanceType: trn1.32xlarge\n    count: 1\n"


def processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry.name}: {cmdline[:200]}")
    return found


def test_bad_fleet_fails_fast_naming_line_and_field(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("nodes:\n  - instanceType: trn2.48xlarge\n    count: -1\n")
    t0 = time.monotonic()
    proc = neuron_dra("dev", "up", "--fleet", str(fleet), "--state-dir", str(tmp_path / "state"))
    assert proc.returncode == 2
    assert (
        f"{fleet}:3: nodes[0].count: expected a whole number from 1 to 1000, got '-1'"
        in proc.stderr
    )
    assert time.monotonic() - t0 < 30
    assert not (tmp_path / "state" / "state.json").exists()


def test_status_without_a_stack_says_so(tmp_path: Path) -> None:
    proc = neuron_dra("dev", "status", "--state-dir", str(tmp_path))
    assert proc.returncode == 3
    assert f"no stack in {tmp_path}" in proc.stdout


@pytest.mark.stack
def test_up_status_down_then_up_again_from_cache_with_another_fleet(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(TINY_FLEET)
    state_dir = tmp_path / "state"
    stack = start_stack(state_dir, fleet=fleet)
    try:
        nodes = stack.get_json("nodes")["items"]
        assert [n["metadata"]["name"] for n in nodes] == ["trn1-32xl-0"]
        labels = nodes[0]["metadata"]["labels"]
        assert labels["node.kubernetes.io/instance-type"] == "trn1.32xlarge"
        assert nodes[0]["status"]["nodeInfo"]["kubeletVersion"] == f"v{stack.k8s_version}"

        status = neuron_dra("dev", "status", "--state-dir", str(state_dir))
        assert status.returncode == 0, status.stdout
        for name in (
            "nats",
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "node-trn1-32xl-0",
        ):
            assert f"  {name}" in status.stdout
        assert "DOWN" not in status.stdout
        kubeconfig = neuron_dra("dev", "kubeconfig", "--state-dir", str(state_dir))
        assert kubeconfig.stdout.strip() == str(stack.kubeconfig)

        # A component that dies is reported, with the tail of its log.
        recorded = json.loads((state_dir / "state.json").read_text())
        sched = next(c for c in recorded["components"] if c["name"] == "kube-scheduler")
        os.kill(sched["pid"], 9)
        time.sleep(0.5)
        status = neuron_dra("dev", "status", "--state-dir", str(state_dir))
        assert status.returncode == 1
        line = next(
            ln for ln in status.stdout.splitlines() if ln.strip().startswith("kube-scheduler")
        )
        assert "DOWN" in line
    finally:
        stop_stack(state_dir)
    assert processes_mentioning(str(state_dir)) == []

    # Second start, of another fleet: binaries come from the cache, so nothing is built
    # again, and the cluster (kept between runs) loses the first fleet's node and its slice.
    other = tmp_path / "other.yaml"
    other.write_text("nodes:\n  - instanceType: inf2.48xlarge\n    count: 1\n")
    t0 = time.monotonic()
    again = neuron_dra(
        "dev", "up", "--detach", "--state-dir", str(state_dir), "--fleet", str(other)
    )
    try:
        assert again.returncode == 0, again.stderr
        assert "building" not in again.stdout.lower()
        assert time.monotonic() - t0 < 120
        assert "removing 1 node an earlier fleet left in the cluster: trn1-32xl-0" in again.stdout

        def left() -> list[str]:
            nodes = stack.get_json("nodes")["items"]
            slices = stack.get_json("resourceslices")["items"]
            return [n["metadata"]["name"] for n in nodes] + [
                s["spec"].get("nodeName", "") for s in slices
            ]

        deadline = time.monotonic() + 60
        while set(left()) != {"inf2-48xl-0"} and time.monotonic() < deadline:
            time.sleep(0.5)
        assert set(left()) == {"inf2-48xl-0"}
    finally:
        stop_stack(state_dir)
    assert processes_mentioning(str(state_dir)) == []


#: What the whole default fleet may take (control plane, nodes, node agents, services, and the
#: health probes, failure detector, audit, alerts and Alertmanager), as ``dev status`` reports
#: it. The proportional set sizes of all components add up to what the stack uses.
FLEET_PSS_LIMIT = 2.5 * 2**30
#: The health components, each also held to its own budget: a probe per node, and once the
#: failure detector, audit, alerts and Alertmanager.
HEALTH_KINDS = ("health-probe", "failure-detector", "audit", "alerts", "alertmanager")
PROBE_PSS_LIMIT = 40 * 2**20
ONCE_PSS_LIMIT = 80 * 2**20
#: A kubelet plugin's own memory: the pages only it maps (forked by the agent zygote, the
#: libraries and the services' code it shares with the zygote and every other agent are not).
PLUGIN_USS_LIMIT = 40 * 2**20
#: Its proportional share: what each further node adds.
PLUGIN_PSS_LIMIT = 50 * 2**20


@pytest.mark.stack
def test_default_fleet_comes_up_light_and_each_claim_change_goes_to_few_watchers(
    tmp_path: Path,
) -> None:
    from neuron_dra_cli.stack.fleet import load_fleet

    from tests.e2e.stack.fanout import claim_change_fanout, claim_watchers
    from tests.fixtures.stack import REPO

    state_dir = tmp_path / "state"
    stack = start_stack(state_dir, fleet=REPO / "deploy" / "fleets" / "default.yaml")
    try:
        fleet = load_fleet(REPO / "deploy" / "fleets" / "default.yaml")
        expected = {n.name for n in fleet.nodes}
        nodes = stack.get_json("nodes")["items"]
        assert {n["metadata"]["name"] for n in nodes} == expected
        status = neuron_dra("dev", "status", "--state-dir", str(state_dir), "-o", "json")
        assert status.returncode == 0, status.stdout
        report = json.loads(status.stdout)
        assert report["up"] == len(report["components"])
        plugins = report["kinds"]["kubelet-plugin"]
        assert plugins["up"] == len(expected)
        shown = f"dev status -o json:\n{status.stdout}"
        kinds = report["kinds"]
        assert report["pssBytes"] <= FLEET_PSS_LIMIT, shown
        probes = kinds["health-probe"]
        assert probes["up"] == plugins["up"], shown
        assert probes["pssBytes"] / probes["up"] <= PROBE_PSS_LIMIT, shown
        for kind in HEALTH_KINDS[1:]:
            assert kinds[kind]["pssBytes"] <= ONCE_PSS_LIMIT, (kind, shown)
        assert plugins["maxUssBytes"] <= PLUGIN_USS_LIMIT, shown
        assert plugins["pssBytes"] / plugins["count"] <= PLUGIN_PSS_LIMIT, shown
        # How long each took to be ready is recorded (and printed) for every component.
        assert all(c["readySeconds"] is not None for c in report["components"]), shown

        text = neuron_dra("dev", "status", "--state-dir", str(state_dir)).stdout
        assert re.search(
            r"kubelet-plugin-trn2-48xl-0 +up +\d+ +\d+ MiB +\d+ MiB +\d+ MiB +[\d.]+ s", text
        )
        assert "MiB of memory in all (proportional set size" in text

        # Claims are followed by the control plane and the operator, not by every node's
        # plugin: one claim change reaches the same few watchers on any size of fleet (the
        # operator's Pending-pod explainer among them).
        watchers = claim_watchers(stack)
        fanout = claim_change_fanout(stack)
        assert watchers <= 4, f"{watchers} watches of ResourceClaims"
        assert fanout < 5, f"each claim change went to {fanout:.1f} watchers"
    finally:
        stop_stack(state_dir)


@pytest.mark.stack
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_foreground_up_stops_everything_on_a_signal(tmp_path: Path, sig: signal.Signals) -> None:
    """`dev up` in the foreground stays until Ctrl-C (or SIGTERM), then stops every process,
    even when the signal arrives twice (a wrapper relaying it)."""
    from tests.fixtures.stack import REPO

    state_dir = tmp_path / "state"
    out = tmp_path / "up.log"
    with open(out, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "neuron_dra_cli",
                "dev",
                "up",
                "--state-dir",
                str(state_dir),
                "--fleet",
                str(REPO / "tests" / "fleets" / "bare.yaml"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            # As a shell starts a background command: SIGINT ignored until the program sets it.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
    try:
        deadline = time.monotonic() + 300
        while b"Press Ctrl-C to stop everything." not in out.read_bytes():
            assert proc.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
        assert processes_mentioning(str(state_dir))
        proc.send_signal(sig)
        time.sleep(0.2)
        proc.send_signal(sig)
        assert proc.wait(timeout=120) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            neuron_dra("dev", "down", "--state-dir", str(state_dir))
    assert "neuron-dra: stopping the stack" in out.read_text()
    assert processes_mentioning(str(state_dir)) == []
