"""A service started as a real process answers its probes and exits cleanly on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures.nats import NatsServer, free_port

ROOT = Path(__file__).resolve().parents[3]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _start(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.runtime.example_service"],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _wait_ready(proc: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        try:
            if _get(f"http://127.0.0.1:{port}/readyz")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError("service never became ready")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_service_exits_cleanly_and_promptly(nats_server: NatsServer, sig: signal.Signals) -> None:
    port = free_port()
    proc = _start({**nats_server.open_env, "NEURON_DRA_HTTP_PORT": str(port)})
    try:
        _wait_ready(proc, port)
        assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        status, metrics = _get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        assert (
            b"neuron_dra_bus_messages_total" in metrics
            or b"neuron_dra_bus_handle_seconds" in metrics
        )
        sent = time.monotonic()
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=10)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr.decode()
    assert took < 3.0, f"shutdown took {took:.1f}s"
    lines = [json.loads(line) for line in stderr.decode().splitlines() if line.startswith("{")]
    messages = [line["message"] for line in lines]
    assert "shutdown requested" in messages
    assert lines[-1]["message"] == "service stopped"
    assert lines[-1]["exit_code"] == 0
    assert all(line["service"] == "example" for line in lines)


def test_bad_setting_fails_start_naming_the_variable(nats_server: NatsServer) -> None:
    proc = _start({"NEURON_DRA_HTTP_PORT": "eighty"})
    _, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 2
    assert "NEURON_DRA_HTTP_PORT='eighty': expected an integer between 0 and 65535" in (
        stderr.decode()
    )


def _failed_start(module: str, nats_server: NatsServer, env: dict[str, str]) -> tuple[str, str]:
    """Run ``python -m module``, which must fail to start with exit code 2; its output and
    the message of its one error line."""
    proc = subprocess.run(
        [sys.executable, "-m", module],
        cwd=ROOT,
        env={
            **os.environ,
            **nats_server.open_env,
            "NEURON_DRA_HTTP_PORT": str(free_port()),
            **env,
        },
        capture_output=True,
        timeout=60,
        check=False,
    )
    out = (proc.stdout + proc.stderr).decode()
    assert proc.returncode == 2, out
    [line] = [json.loads(text) for text in out.splitlines() if '"level":"error"' in text]
    return out, str(line["message"])


@pytest.mark.parametrize(
    ("module", "kubeconfig", "said"),
    [
        ("neuron_dra_slice_publisher", None, "kubeconfig {path}: no such file"),
        (
            "neuron_dra_ultraserver_operator",
            "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', "
            "proxy-url: 'socks5://proxy:1080'}}]\nusers: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
            "kubeconfig {path}: clusters['c'].cluster.proxy-url is 'socks5://proxy:1080': "
            "only http:// and https:// proxies are supported",
        ),
    ],
)
def test_a_kubeconfig_that_cannot_be_used_fails_start_in_one_line(
    nats_server: NatsServer, tmp_path: Path, module: str, kubeconfig: str | None, said: str
) -> None:
    path = tmp_path / "kubeconfig"
    if kubeconfig is not None:
        path.write_text(kubeconfig)
    out, error = _failed_start(module, nats_server, {"NEURON_DRA_KUBECONFIG": str(path)})
    assert "Traceback" not in out
    assert error == "cannot start: " + said.format(path=path)


def test_a_start_that_fails_after_connecting_closes_its_kubernetes_client(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """The start error is the process's last word: the client the failed build left open is
    closed, not reported by aiohttp as an unclosed session after it."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    out, error = _failed_start(
        "tests.integration.runtime.example_service",
        nats_server,
        {"EXAMPLE_FAIL_AFTER_KUBECONFIG": str(kubeconfig)},
    )
    assert "Unclosed" not in out
    assert error == "cannot start: the example cannot go on"


def test_stop_while_still_starting_exits_cleanly(nats_server: NatsServer, tmp_path: Path) -> None:
    """SIGTERM while the service is still connecting (a slow build) is an orderly exit, not
    a kill by the default signal action."""
    log = tmp_path / "service.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.runtime.example_service"],
            cwd=ROOT,
            env={
                **os.environ,
                **nats_server.open_env,
                "NEURON_DRA_HTTP_PORT": str(free_port()),
                "EXAMPLE_BUILD_DELAY": "60",
            },
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while b'"building"' not in log.read_bytes():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the service never started building"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0, log.read_text()
    assert "shutdown requested before the service started" in log.read_text()
