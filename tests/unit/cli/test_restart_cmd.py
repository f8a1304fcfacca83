"""``neuron-dra dev restart``: a component comes back the way it was started, on its port,
with its environment; refusals name the problem."""

from __future__ import annotations

import sys
import time
import urllib.request
from pathlib import Path

import pytest
from neuron_dra_cli.main import main
from neuron_dra_cli.restart_cmd import restart_component
from neuron_dra_cli.stack import process, state

# Serves its environment's MARK at / (what the restarted process got is what a client sees).
SERVER = """
import http.server, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = os.environ["MARK"].encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


# Exits at its first start (as an apiserver whose storage answered too late), serves after.
FLAKY = (
    """
import os, pathlib, sys
first = pathlib.Path(sys.argv[2])
if not first.exists():
    first.write_text("started once")
    sys.exit(1)
"""
    + SERVER
)

# Never comes up, and says why at once (a shell, so that even a loaded machine runs it many
# times within the test's timeout).
BROKEN = ("/bin/sh", "-c", "echo no storage; exit 1")


def _fetch(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:
        return bytes(answer.read()).decode()


def _stack(
    tmp_path: Path, *, recorded: bool = True, restarted_as: str | tuple[str, ...] = SERVER
) -> tuple[Path, int, process.Running]:
    port = process.free_port()
    argv = (sys.executable, "-c", SERVER, str(port))
    again = (
        restarted_as
        if isinstance(restarted_as, tuple)
        else (sys.executable, "-c", restarted_as, str(port), str(tmp_path / "first"))
    )
    env = {"MARK": "same environment"}
    log = tmp_path / "web.log"
    running = process.start(argv, log_path=log, env=env)
    entry = state.ComponentState(
        name="web",
        kind="web",
        pid=running.pid,
        start_ticks=running.start_ticks,
        log=str(log),
        ports={"http": port},
        argv=again if recorded else (),
        env=env if recorded else {},
    )
    state.save(
        tmp_path,
        state.StackState(
            k8s_version="1.36.3",
            fleet="f",
            kubeconfig="k",
            apiserver="a",
            nats_url="n",
            components=(entry,),
        ),
    )
    return tmp_path, port, running


def _stop_all(root: Path) -> None:
    current = state.load(root)
    assert current is not None
    process.stop(
        [process.Running(pid=c.pid, start_ticks=c.start_ticks) for c in current.components]
    )


def _wait_open(port: int) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            _fetch(port)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


# The stack lets go of the processes it starts; Python reports such a handle when collected.
@pytest.mark.filterwarnings("ignore:subprocess .* is still running:ResourceWarning")
@pytest.mark.parametrize("kill", [False, True])
def test_restart_brings_the_component_back_as_it_was(tmp_path: Path, *, kill: bool) -> None:
    root, port, old = _stack(tmp_path)
    _wait_open(port)
    done = restart_component(root, name="web", kill=kill, down_seconds=0.3)
    try:
        assert not process.alive(old)
        assert done.old_pid == old.pid
        assert done.pid != old.pid
        assert done.away_seconds >= 0.3
        assert _fetch(port) == "same environment"
        current = state.load(root)
        assert current is not None
        [entry] = current.components
        assert entry.pid == done.pid
        assert entry.ready_seconds is not None
        assert entry.argv[3] == str(port)
        assert (tmp_path / "web.log").read_text().count("--- ") == 2
    finally:
        _stop_all(root)


@pytest.mark.filterwarnings("ignore:subprocess .* is still running:ResourceWarning")
def test_refusals_name_the_component_and_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _, old = _stack(tmp_path, recorded=False)
    try:
        assert main(["dev", "restart", "nats", "--state-dir", str(root)]) != 0
        assert "no component 'nats' in the stack" in capsys.readouterr().err
        assert main(["dev", "restart", "web", "--state-dir", str(root)]) != 0
        err = capsys.readouterr().err
        assert "web was not started by `neuron-dra dev up`" in err
        assert process.alive(old)  # refused before anything was stopped
        assert main(["dev", "restart", "web", "--down", "-1", "--state-dir", str(root)]) != 0
        assert "--down -1.0: want 0 or more seconds" in capsys.readouterr().err
        empty = tmp_path / "none"
        assert main(["dev", "restart", "web", "--state-dir", str(empty)]) != 0
        assert "no stack recorded under" in capsys.readouterr().err
    finally:
        process.stop([old])


@pytest.mark.filterwarnings("ignore:subprocess .* is still running:ResourceWarning")
def test_a_component_that_exits_while_starting_is_started_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, port, _ = _stack(tmp_path, restarted_as=FLAKY)
    _wait_open(port)
    try:
        done = restart_component(root, name="web", kill=True)
        assert done.starts == 2
        assert _fetch(port) == "same environment"
        assert "web exited while starting" in capsys.readouterr().err
        current = state.load(root)
        assert current is not None
        assert current.components[0].pid == done.pid
    finally:
        _stop_all(root)


@pytest.mark.filterwarnings("ignore:subprocess .* is still running:ResourceWarning")
def test_a_component_that_keeps_exiting_is_reported_once_the_timeout_passed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, port, _ = _stack(tmp_path, restarted_as=BROKEN)
    _wait_open(port)
    try:
        assert main(["dev", "restart", "web", "--timeout", "2", "--state-dir", str(root)]) != 0
        err = capsys.readouterr().err
        assert "web kept exiting while starting for 2 s" in err
        assert "no storage" in err
    finally:
        _stop_all(root)
