"""Real simulated hardware, read back by the real reader, for the slice tests."""

from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path

from neuron_dra_common.hardware.model import NodeHardware
from neuron_dra_common.hardware.node import read_node
from neuron_dra_common.hardware.simulate import SimUltraServer, ultraserver_members, write_node

US_LABELS = {
    "topology.k8s.aws/capacity-block-id": "cr-0123456789abcdef0",
    "topology.k8s.aws/network-node-layer-1": "nn-1111",
    "topology.k8s.aws/network-node-layer-2": "nn-2222",
    "topology.k8s.aws/network-node-layer-3": "nn-3333",
}


@functools.cache
def hardware(
    instance_type: str, *, driver: str = "2.24.7.0", ultraserver_node: int | None = None
) -> NodeHardware:
    """The hardware of one simulated node of ``instance_type``, as discovery reads it."""
    root = Path(tempfile.mkdtemp(prefix="slices-hw-"))
    us: SimUltraServer | None = None
    if ultraserver_node is not None:
        us = ultraserver_members(index=0)[ultraserver_node]
    sim = write_node(
        root, instance_type=instance_type, node_name="n", driver_version=driver, ultraserver=us
    )
    try:
        return read_node(sim.root, neuron_ls_command=sim.neuron_ls_command)
    finally:
        shutil.rmtree(root)
