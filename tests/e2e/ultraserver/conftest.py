"""A stack of three UltraServers with the whole product running: discovery, the slice
publisher and the kubelet plugin on every node, the topology allocator and the operator.

Whatever ``dev up`` does not start yet is started here with the stack's own component
definitions and recorded in its state, so ``dev down`` stops it too.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from neuron_dra_cli.stack import lifecycle, services, state
from neuron_dra_cli.stack.fleet import load_fleet
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_cli.stack.plugin import plugin_components
from neuron_dra_cli.stack.ultraserver import ultraserver_components

from tests.fixtures.stack import REPO, KubeStack, start_stack, stop_stack

FLEET = REPO / "tests" / "fleets" / "ultraserver.yaml"


def _running_kinds(state_dir: Path) -> set[str]:
    current = json.loads((state_dir / "state.json").read_text())
    return {c["kind"] for c in current["components"]}


@pytest.fixture(scope="session")
def us_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    state_dir = tmp_path_factory.mktemp("us-stack")
    stack = start_stack(state_dir, fleet=FLEET)
    try:
        layout = Layout(state_dir)
        kinds = _running_kinds(state_dir)
        current = state.load(state_dir)
        assert current is not None
        launcher = lifecycle.Launcher(layout, current, progress=lambda _: None)
        # The launcher lets go of each process object at once (the state file tracks the
        # pid), which Python reports as a ResourceWarning: expected here.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            if "slice-publisher" not in kinds:
                services.apply_cluster_objects(stack.kubeconfig)
                launcher.start(
                    services.product_components(
                        fleet=load_fleet(FLEET),
                        layout=layout,
                        nats_url=stack.nats_url,
                        kubeconfig=stack.kubeconfig,
                    ),
                    timeout=120,
                )
            if "kubelet-plugin" not in kinds:
                launcher.start(
                    plugin_components(
                        fleet=load_fleet(FLEET),
                        layout=layout,
                        nats_url=stack.nats_url,
                        kubeconfig=stack.kubeconfig,
                    ),
                    timeout=180,
                )
            if "ultraserver-operator" not in kinds:
                launcher.start(
                    ultraserver_components(nats_url=stack.nats_url, kubeconfig=stack.kubeconfig),
                    timeout=60,
                )
        stack.wait_for(
            "three NeuronUltraServers",
            lambda: len(stack.get_json("nus", "-n", "neuron-dra-driver")["items"]) == 3,
            timeout=120,
        )
        yield stack
    finally:
        stop_stack(state_dir)
