"""AWS's UltraServer guide on Trn3 with EFA: the guide's own Trn3 workload of two
UltraServers, its `efa-claim-template` beside the Neuron claim. AWS publishes 16 EFA
interfaces per Trn3 node but no map aligning them with Neuron devices, so the simulated
interfaces carry no devicegroup ids and `allocationMode: All` takes all 16 of each node."""

from __future__ import annotations

import pytest

from tests.e2e.efa.test_ultraserver_efa import EXAMPLES, guide_with_efa
from tests.fixtures.stack import KubeStack

pytestmark = pytest.mark.stack


def test_the_guide_on_trn3_gets_every_efa_of_each_node(trn3_stack: KubeStack) -> None:
    guide_with_efa(trn3_stack, EXAMPLES / "ultraserver" / "trn3-workload.yaml")
