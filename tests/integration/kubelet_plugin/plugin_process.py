"""One kubelet plugin process on a node directory, as a rolling update starts a second one.

``python -m tests.integration.kubelet_plugin.plugin_process <root> <pod-uid>`` recovers the
checkpoint ``<root>/checkpoint.json`` (CDI specs under ``<root>/cdi``), serves the DRA API on
``<root>/kubelet`` with the pod UID in its socket names (as the DaemonSet's pods do), prints
``serving`` and runs until SIGTERM. Its claims are :data:`CLAIMS`: claim ``i`` holds
``neurondevice<i>``. With ``NEURON_DRA_PLUGIN_CRASH_AT`` set it kills itself at that step, as
the plugin does.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from neuron_dra_kubelet_plugin import faults
from neuron_dra_kubelet_plugin.checkpoint import CheckpointStore
from neuron_dra_kubelet_plugin.health import StaticHealth
from neuron_dra_kubelet_plugin.preparer import Effects, NodePreparer
from neuron_dra_kubelet_plugin.registration import socket_paths
from neuron_dra_kubelet_plugin.servers import serve

from tests.unit.kubelet_plugin.support import NODE, MemoryClaims, make_claim, trn2_node

BOOT = "boot-1"
CLAIMS = MemoryClaims([make_claim(f"u{i}", [i], name=f"c{i}") for i in range(16)])


def preparer(root: Path, crash: faults.CrashPoint = faults.no_crash) -> NodePreparer:
    return NodePreparer(
        node=trn2_node(),
        claims=CLAIMS,
        effects=Effects(store=CheckpointStore(root / "checkpoint.json"), cdi_root=root / "cdi"),
        boot_id=BOOT,
        crash=crash,
    )


async def run(root: Path, pod_uid: str) -> None:
    plugin = preparer(root, faults.from_env())
    plugin.recover()
    stopped = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
    health = StaticHealth(pool=NODE, devices=[f"neurondevice{i}" for i in range(16)])
    async with serve(
        socket_paths(root / "kubelet", pod_uid=pod_uid), preparer=plugin, health=health
    ):
        sys.stdout.write("serving\n")
        sys.stdout.flush()
        await stopped.wait()


if __name__ == "__main__":
    asyncio.run(run(Path(sys.argv[1]), sys.argv[2]))
