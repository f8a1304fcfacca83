"""A stack of its own for the hardware-description tests: the control plane and simulated
nodes of ``tests/fleets/describe.yaml``, plus discovery per node and the slice publisher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from neuron_dra_cli.stack.fleet import load_fleet
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_cli.stack.services import apply_cluster_objects, product_components

from tests.fixtures.stack import REPO, KubeStack, start_stack, stop_stack

FLEET = REPO / "tests" / "fleets" / "describe.yaml"


def launch(argv: list[str], *, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}
        )


def pools_complete(stack: KubeStack, nodes: list[str]) -> bool:
    """Every node has a pool whose newest generation is all there."""
    items = stack.get_json("resourceslices")["items"]
    for node in nodes:
        mine = [s for s in items if s["spec"].get("nodeName") == node]
        if not mine:
            return False
        top = max(s["spec"]["pool"]["generation"] for s in mine)
        current = [s for s in mine if s["spec"]["pool"]["generation"] == top]
        if len(current) != current[0]["spec"]["pool"]["resourceSliceCount"]:
            return False
    return True


# Package scope: the stack stops when its package's tests are done, so the next
# package's stack never runs beside it on a small machine.
@pytest.fixture(scope="package")
def describe_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    state_dir = tmp_path_factory.mktemp("describe")
    stack = start_stack(state_dir, fleet=FLEET)
    started: list[subprocess.Popen[bytes]] = []
    try:
        layout = Layout(state_dir)
        recorded = json.loads((state_dir / "state.json").read_text())
        if not any(c["kind"] == "slice-publisher" for c in recorded.get("components", [])):
            # The stack's own lifecycle does not start the product yet: start it here.
            apply_cluster_objects(stack.kubeconfig)
            fleet = load_fleet(FLEET)
            for c in product_components(
                fleet=fleet, layout=layout, nats_url=stack.nats_url, kubeconfig=stack.kubeconfig
            ):
                env = {**c.env, **stack.service_env()}
                started.append(launch(c.argv, log=layout.log(c.name), env=env))
        nodes = [n.name for n in load_fleet(FLEET).nodes]
        stack.wait_for("every pool", lambda: pools_complete(stack, nodes), timeout=120)
        yield stack
    finally:
        for proc in started:
            proc.send_signal(signal.SIGTERM)
        for proc in started:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        stop_stack(state_dir)


@pytest.fixture
def ns(describe_stack: KubeStack) -> Iterator[str]:
    """A namespace of the test's own; its pods and claims are gone before the next test."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    describe_stack.create_namespace(name)
    try:
        yield name
    finally:
        describe_stack.kubectl(
            "delete", "pods", "--all", "-n", name, "--force", "--grace-period=0", check=False
        )
        describe_stack.wait_for(
            f"claims of {name} released",
            lambda: not describe_stack.get_json("resourceclaims", "-n", name)["items"],
            timeout=60,
        )
        describe_stack.kubectl("delete", "namespace", name, "--wait=false", check=False)
