"""The agent zygote: an agent it forks runs its own main, as `python -m` would, in a session
of its own, and stops in order on SIGTERM; the zygote forks only with nothing that a fork
breaks (threads, event loops, open sockets)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from neuron_dra_cli.stack import components, process, state, zygote
from neuron_dra_cli.stack.components import Component
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_cli.stack.lifecycle import Launcher, stop_all

from tests.unit.stack.forked_agent import REPORT_ENV

REPO = Path(__file__).resolve().parents[3]
AGENT = "tests.unit.stack.forked_agent"

pytestmark = pytest.mark.filterwarnings("ignore:subprocess .* is still running:ResourceWarning")


@pytest.fixture
def launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Launcher]:
    """A launcher with the agent zygote started and ready, as ``dev up`` has it."""
    monkeypatch.chdir(REPO)  # where the zygote (and so its agents) import the tests from
    layout = Layout(tmp_path / "state")
    current = state.StackState(
        k8s_version="test", fleet="none", kubeconfig="none", apiserver="none", nats_url="none"
    )
    launched = Launcher(layout, current, progress=lambda _: None)
    layout.ensure_short_nodes()
    try:
        launched.wait(
            [launched.launch(components.agent_zygote(socket=layout.zygote_socket))],
            timeout=120,
        )
        launched.zygote = layout.zygote_socket
        yield launched
    finally:
        stop_all(launched.current, timeout=10)
        layout.short_nodes.unlink(missing_ok=True)


def agent(tmp_path: Path, name: str) -> Component:
    report = tmp_path / f"{name}.json"
    port = process.free_port()
    return Component(
        name=name,
        kind="forked-agent",
        argv=[sys.executable, "-m", AGENT, "--log-level", "warning"],
        ports={"http": port},
        ready=report.exists,
        env={
            REPORT_ENV: str(report),
            "FORKED_AGENT_MARK": name,
            "NEURON_DRA_HTTP_HOST": "127.0.0.1",
            "NEURON_DRA_HTTP_PORT": str(port),
        },
        module=AGENT,
    )


def wait_for(predicate: object, *, timeout: float, what: str) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_forked_agent_runs_its_own_main_and_stops_in_order_on_sigterm(
    tmp_path: Path, launcher: Launcher
) -> None:
    items = [agent(tmp_path, f"agent-{i}") for i in range(2)]
    launcher.start(items, timeout=60)
    recorded = {c.name: c for c in launcher.current.components}
    zygote_pid = recorded[zygote.KIND].pid
    assert recorded[zygote.KIND].ready_seconds is not None
    for item in items:
        entry = recorded[item.name]
        assert entry.forked, "started by the zygote, not by argv"
        seen = json.loads((tmp_path / f"{item.name}.json").read_text())
        # Its own process and session (what `dev down` signals), its own argv and environment
        # read by its own main, run as __main__ on a loop made in the child.
        assert seen["pid"] == entry.pid != zygote_pid
        assert seen["sid"] == entry.pid
        assert seen["argv"] == ["--log-level", "warning"]
        assert seen["log_level"] == "warning"
        assert seen["http_port"] == item.ports["http"]
        assert seen["env"] == item.name
        assert seen["main"] == "__main__"
        assert seen["loop"].startswith("uvloop")
        assert seen["python_threads"] == 1
        assert seen["cwd"] == str(REPO)
        log = Path(entry.log).read_text()
        assert log.startswith("--- "), log
        assert f"python -m {AGENT} (forked) --log-level warning" in log.splitlines()[0]

    # SIGTERM to its process group, as `dev down` and `dev restart` send it.
    first = recorded["agent-0"]
    os.killpg(first.pid, signal.SIGTERM)
    zygote_log = Path(recorded[zygote.KIND].log)
    wait_for(
        lambda: f"pid {first.pid} exited" in zygote_log.read_text(),
        timeout=30,
        what=f"agent-0 did not stop on SIGTERM:\n{Path(first.log).read_text()}",
    )
    assert f"pid {first.pid} exited (code 0)" in zygote_log.read_text()
    assert process.alive(process.running(recorded["agent-1"].pid)), "only the one signalled"

    # `dev down`: every agent first, then the zygote, none left behind.
    stop_all(launcher.current, timeout=10)
    second = recorded["agent-1"].pid
    text = zygote_log.read_text()
    assert f"pid {second} exited (code 0)" in text, text
    assert "agent-zygote: stopped" in text
    assert not any(process.alive(process.running(c.pid)) for c in recorded.values())


def test_the_zygote_refuses_a_request_it_cannot_run_and_goes_on(
    tmp_path: Path, launcher: Launcher
) -> None:
    assert launcher.zygote is not None
    refused = zygote.ask(launcher.zygote, {"op": "spawn", "module": AGENT, "args": 1}, timeout=10)
    assert refused == {"error": "spawn: 'args' must be a list of strings"}
    pid = zygote.spawn(
        launcher.zygote,
        module="no_such_module_here",
        env=dict(os.environ),
        log=tmp_path / "missing.log",
        name="missing",
    )
    log = tmp_path / "missing.log"
    wait_for(
        lambda: log.exists() and "No module named no_such_module_here" in log.read_text(),
        timeout=30,
        what="a module that is not there fails in its own log, as `python -m` does",
    )
    assert pid > 0
    assert zygote.ping(launcher.zygote)


# In a process of its own: what the zygote imports, then what it checks before each fork.
HAZARDS = """
import asyncio, json, socket, sys, threading
from neuron_dra_cli.stack import zygote
failed = zygote.preload(zygote.LIBRARIES, zygote.SERVICE_PACKAGES)
found = {"failed": failed, "clean": zygote.fork_hazards()}
sock = socket.socket()
found["socket"] = zygote.fork_hazards()
found["socket_kept"] = zygote.fork_hazards(keep_fds=[sock.fileno()])
sock.close()
stop = threading.Event()
worker = threading.Thread(target=stop.wait, name="worker")
worker.start()
found["thread"] = zygote.fork_hazards()
stop.set()
worker.join()
async def inside():
    return zygote.fork_hazards()
found["loop"] = asyncio.run(inside())
print(json.dumps(found))
"""


def test_the_zygote_holds_no_thread_loop_or_socket_when_it_forks() -> None:
    """Importing every library and service leaves one thread, no loop and no socket (grpcio,
    uvloop, aiohttp, kubernetes-asyncio and the services make theirs in the agents); each of
    those, made before a fork, is named."""
    out = subprocess.run(
        [sys.executable, "-c", HAZARDS],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )
    found = json.loads(out.stdout)
    assert found["failed"] == []
    assert found["clean"] == []
    assert found["socket_kept"] == []
    assert len(found["socket"]) == 1
    assert "is an open socket" in found["socket"][0]
    assert found["thread"] == ["2 threads run (Python's: MainThread, worker)"]
    # (besides the sockets a loop keeps to wake itself up; and a thread joined just before
    # may still be leaving the kernel's list)
    assert "an event loop is running" in found["loop"]


def test_dev_restart_forks_a_forked_agent_again(tmp_path: Path, launcher: Launcher) -> None:
    from neuron_dra_cli.restart_cmd import restart_component

    launcher.start([agent(tmp_path, "agent-r")], timeout=60)
    before = next(c for c in launcher.current.components if c.name == "agent-r")
    (tmp_path / "agent-r.json").unlink()
    done = restart_component(launcher.layout.root, name="agent-r", timeout=60)
    current = state.load(launcher.layout.root)
    assert current is not None
    launcher.current = current  # so that the fixture stops the new process
    after = next(c for c in current.components if c.name == "agent-r")
    assert done.old_pid == before.pid != after.pid == done.pid
    assert after.forked
    zygote_log = Path(next(c for c in current.components if c.kind == zygote.KIND).log)
    assert f"forked agent-r (python -m {AGENT}) as pid {after.pid}" in zygote_log.read_text()
    assert f"pid {before.pid} exited (code 0)" in zygote_log.read_text()
    wait_for((tmp_path / "agent-r.json").exists, timeout=30, what="the new agent's main ran")
    assert json.loads((tmp_path / "agent-r.json").read_text())["pid"] == after.pid
