"""The plugin's gRPC servers on real unix sockets, for the tests that call them."""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from neuron_dra_common.grpcserver import MAX_UNIX_PATH
from neuron_dra_kubelet_plugin.checkpoint import CheckpointStore
from neuron_dra_kubelet_plugin.health import StaticHealth
from neuron_dra_kubelet_plugin.preparer import Effects, NodePreparer
from neuron_dra_kubelet_plugin.registration import socket_paths
from neuron_dra_kubelet_plugin.servers import PluginServers, serve

from tests.unit.kubelet_plugin.support import (
    NODE,
    MemoryClaims,
    make_claim,
    opaque,
    trn2_node,
)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """tmp_path, or a shorter directory when socket paths under it would not fit."""
    probe = tmp_path / "plugins_registry" / "neuron.aws.com-0123456789abcdef-reg.sock"
    if len(os.fsencode(probe)) <= MAX_UNIX_PATH:
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(prefix="kp-", dir="/tmp") as short:
        yield Path(short)


CLAIMS = MemoryClaims(
    [
        make_claim("u-1x4", [2, 3, 1, 0], name="pod0-neurons"),
        make_claim(
            "u-lnc1",
            list(range(8, 16)),
            name="lnc1",
            config=[opaque("NeuronConfig", logicalNeuronCore=1)],
        ),
        make_claim("u-bad", [4], name="bad", config=[opaque("NeuronConfig", logicalNeuronCore=3)]),
        make_claim("u-sub", [5], name="sub", request="neurons/one"),
    ]
)


@pytest.fixture
async def plugin(root: Path) -> AsyncIterator[tuple[PluginServers, StaticHealth]]:
    preparer = NodePreparer(
        node=trn2_node(),
        claims=CLAIMS,
        effects=Effects(store=CheckpointStore(root / "checkpoint.json"), cdi_root=root / "cdi"),
        boot_id="boot-1",
    )
    preparer.recover()
    health = StaticHealth(pool=NODE, devices=[f"neurondevice{i}" for i in range(16)])
    async with serve(
        socket_paths(root / "kubelet"), preparer=preparer, health=health, heartbeat_seconds=0.2
    ) as servers:
        yield servers, health
