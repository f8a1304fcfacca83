"""Two plugin processes on one node share its checkpoint, as during a rolling update.

The DaemonSet rolls with ``maxSurge: 1``: the new pod starts, recovers and serves while the
old one still serves, both on the node's one checkpoint and CDI directory. The kubelet may
send a claim to either. Neither may write a stale view over the other's claims: after both
are gone, a restart must find every claim still prepared and delete no live CDI spec. And
when one of the two dies at any step of a prepare or unprepare, the kubelet's retry on the
other converges.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import NamedTuple

import grpc
import pytest
from neuron_dra_common import cdi
from neuron_dra_kubelet_plugin.checkpoint import CheckpointStore
from neuron_dra_kubelet_plugin.faults import CRASH_ENV, STEPS
from neuron_dra_kubelet_plugin.registration import socket_paths
from neuron_dra_protos.dra.v1 import dra_pb2 as v1
from neuron_dra_protos.dra.v1 import dra_pb2_grpc as v1_grpc

from tests.integration.kubelet_plugin.plugin_process import preparer

REPO = Path(__file__).resolve().parents[3]
CLAIMS = 16


@pytest.fixture
def root() -> Iterator[Path]:
    # Socket paths must stay short: not under pytest's tmp_path.
    with tempfile.TemporaryDirectory(prefix="kp-", dir="/tmp") as short:
        yield Path(short)


class Plugin(NamedTuple):
    socket: Path  # its DRA socket
    proc: subprocess.Popen[bytes]


@contextlib.contextmanager
def plugin_process(root: Path, pod_uid: str, *, crash_at: str = "") -> Iterator[Plugin]:
    """A plugin process serving on ``root`` until the block ends (then SIGTERM)."""
    log = root / f"{pod_uid}.log"
    args = (str(root), pod_uid)
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.kubelet_plugin.plugin_process", *args],
            stdout=subprocess.PIPE,
            stderr=err,
            cwd=REPO,
            env={**os.environ, CRASH_ENV: crash_at},
        )
    assert proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        line = proc.stdout.readline() if ready else b""
        assert line == b"serving\n", f"plugin {pod_uid} did not serve: {log.read_text()}"
        yield Plugin(socket_paths(root / "kubelet", pod_uid=pod_uid).dra, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


@contextlib.asynccontextmanager
async def stub(socket: Path) -> AsyncIterator[v1_grpc.DRAPluginAsyncStub]:
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        yield v1_grpc.DRAPluginStub(channel)


async def prepare(plugin: v1_grpc.DRAPluginAsyncStub, i: int) -> str:
    claim = v1.Claim(namespace="default", name=f"c{i}", uid=f"u{i}")
    response = await plugin.NodePrepareResources(
        v1.NodePrepareResourcesRequest(claims=[claim]), timeout=60
    )
    return str(response.claims[f"u{i}"].error)


async def unprepare(plugin: v1_grpc.DRAPluginAsyncStub, i: int) -> str:
    claim = v1.Claim(namespace="default", name=f"c{i}", uid=f"u{i}")
    response = await plugin.NodeUnprepareResources(
        v1.NodeUnprepareResourcesRequest(claims=[claim]), timeout=60
    )
    return str(response.claims[f"u{i}"].error)


def on_disk(root: Path) -> set[str]:
    return set(CheckpointStore(root / "checkpoint.json").load().claims)


async def test_two_plugin_processes_keep_each_others_claims(root: Path) -> None:
    kept = {f"u{i}" for i in range(CLAIMS) if i % 4}
    with plugin_process(root, "old-pod") as old, plugin_process(root, "new-pod") as new:
        async with stub(old.socket) as old_plugin, stub(new.socket) as new_plugin:
            plugins = (old_plugin, new_plugin)
            # The kubelet sends every other claim to each; both prepare at the same time.
            errors = await asyncio.gather(*(prepare(plugins[i % 2], i) for i in range(CLAIMS)))
            assert errors == [""] * CLAIMS
            assert on_disk(root) == {f"u{i}" for i in range(CLAIMS)}
            # Each answers for a claim the other prepared, and releases some of them.
            again = await asyncio.gather(*(prepare(plugins[(i + 1) % 2], i) for i in range(4)))
            assert again == [""] * 4
            released = await asyncio.gather(
                *(unprepare(plugins[(i + 1) % 2], i) for i in range(0, CLAIMS, 4))
            )
            assert released == [""] * (CLAIMS // 4)
            assert on_disk(root) == kept
    # The new pod restarts (or a third one rolls in): nothing live is an orphan.
    restarted = preparer(root)
    recovery = restarted.recover()
    assert (recovery.orphan_specs, recovery.rolled_back) == ((), ())
    assert set(restarted.checkpoint.claims) == kept
    assert cdi.claim_spec_uids(root / "cdi") == kept


@pytest.mark.parametrize("step", STEPS)
async def test_a_pod_killed_at_any_step_while_the_other_serves_converges(
    root: Path, step: str
) -> None:
    # The old pod dies (kill -9, at the named step) in the middle of the kubelet's call; the
    # kubelet calls again, and now the new pod answers, on the checkpoint the old one left.
    bystanders = {f"u{i}" for i in range(4)}
    target = 8
    with (
        plugin_process(root, "new-pod") as new,
        plugin_process(root, "old-pod", crash_at=step) as old,
    ):
        async with stub(new.socket) as new_plugin, stub(old.socket) as old_plugin:
            assert await asyncio.gather(*(prepare(new_plugin, i) for i in range(4))) == [""] * 4
            if step.startswith("prepare:"):
                call, expected = prepare, bystanders | {f"u{target}"}
            else:
                assert await prepare(new_plugin, target) == ""
                call, expected = unprepare, bystanders
            with pytest.raises(grpc.aio.AioRpcError):
                await call(old_plugin, target)
            assert old.proc.wait(30) == -signal.SIGKILL
            assert await call(new_plugin, target) == ""
            assert on_disk(root) == expected
            assert cdi.claim_spec_uids(root / "cdi") == expected
            # The kubelet may call once more; the answer stays the same.
            assert await call(new_plugin, target) == ""
    # Whoever runs next on the node finds nothing half done and nothing orphaned.
    restarted = preparer(root)
    recovery = restarted.recover()
    assert (recovery.orphan_specs, recovery.rolled_back) == ((), ())
    assert set(restarted.checkpoint.claims) == expected
    assert cdi.claim_spec_uids(root / "cdi") == expected
    held = [d for claim in restarted.checkpoint.claims.values() for d in claim.devices]
    assert len(held) == len(set(held)) == len(expected)
