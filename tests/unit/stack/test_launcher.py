"""The stack's launcher on real processes: a few starting at a time, each one's start-to-ready
time recorded, a silent or dead component named with its log; the shared bytecode cache."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from neuron_dra_cli.errors import CliError
from neuron_dra_cli.stack import bytecode, process, state
from neuron_dra_cli.stack.components import Component
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_cli.stack.lifecycle import Launcher, stop_all

# The launcher lets go of each process it starts (a detached stack outlives the command that
# started it); Python reports such a handle as a ResourceWarning when it is collected.
pytestmark = pytest.mark.filterwarnings("ignore:subprocess .* is still running:ResourceWarning")


def marker_component(tmp: Path, name: str, *, delay: float, code: str = "") -> Component:
    """A process that is ready once it has written its marker file, ``delay`` s in."""
    marker = tmp / f"{name}.ready"
    script = code or (
        f"import pathlib, time; time.sleep({delay}); "
        f"pathlib.Path({str(marker)!r}).touch(); print('ready', flush=True); time.sleep(60)"
    )
    return Component(
        name=name,
        kind="probe",
        argv=[sys.executable, "-c", script],
        ports={},
        ready=marker.exists,
    )


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    current = state.StackState(
        k8s_version="test", fleet="none", kubeconfig="none", apiserver="none", nats_url="none"
    )
    launched = Launcher(Layout(tmp_path / "state"), current, progress=lambda _: None)
    try:
        yield launched
    finally:
        stop_all(launched.current, timeout=5)


def test_at_most_parallel_start_at_once_and_each_ready_time_is_recorded(
    tmp_path: Path, launcher: Launcher
) -> None:
    items = [marker_component(tmp_path, f"c{i}", delay=0.4) for i in range(5)]
    launcher.start(items, timeout=30, parallel=2)
    recorded = {c.name: c for c in state.load(launcher.layout.root).components}  # type: ignore[union-attr]
    assert list(recorded) == [f"c{i}" for i in range(5)], "recorded in order"
    for c in recorded.values():
        assert c.ready_seconds is not None
        assert 0.4 <= c.ready_seconds < 10
        assert process.alive(process.Running(pid=c.pid, start_ticks=c.start_ticks))
    ready_at = sorted(c.started_at + (c.ready_seconds or 0) for c in recorded.values())
    # The third starts only once one of the first two is ready, and so on.
    for i in range(2, 5):
        assert recorded[f"c{i}"].started_at >= ready_at[i - 2] - 0.05


def test_a_component_that_stays_silent_is_named_with_its_log(
    tmp_path: Path, launcher: Launcher
) -> None:
    silent = marker_component(
        tmp_path,
        "silent",
        delay=0,
        code="print('importing', flush=True); import time; time.sleep(60)",
    )
    with pytest.raises(CliError, match=r"silent was not ready 1 s after its start") as caught:
        launcher.start([silent], timeout=1.0)
    assert "importing" in str(caught.value)


def test_a_component_that_exits_is_named_with_its_log(tmp_path: Path, launcher: Launcher) -> None:
    dying = marker_component(
        tmp_path, "dying", delay=0, code="import sys; print('bad setting'); sys.exit(2)"
    )
    with pytest.raises(CliError, match="dying exited while starting") as caught:
        launcher.start([dying], timeout=30)
    assert "bad setting" in str(caught.value)


def test_services_share_compiled_bytecode_even_where_writing_it_is_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "src"
    (source / "agent").mkdir(parents=True)
    (source / "agent" / "__init__.py").write_text("")
    (source / "agent" / "wiring.py").write_text("import colorsys\n")
    (source / "late.py").write_text("X = 1\n")
    monkeypatch.setenv("PYTHONPATH", str(source))
    monkeypatch.setenv("NEURON_DRA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    assert not bytecode.is_warm(("agent",))
    bytecode.start_warmup(("agent",)).wait(timeout=120)
    assert bytecode.is_warm(("agent",)), "the next start finds it done"
    prefix = bytecode.pycache_dir()
    compiled = {p.name.split(".")[0] for p in prefix.rglob("*.pyc")}
    assert {"__init__", "wiring", "colorsys"} <= compiled, "its modules and what they import"

    # A service process started with the stack's environment reads (and adds to) the cache.
    env = {**os.environ, **bytecode.python_env()}
    subprocess.run([sys.executable, "-c", "import late"], env=env, check=True, timeout=60)
    assert any(p.name.startswith("late.") for p in prefix.rglob("*.pyc"))

    # A changed source (or a new module in a package) makes it compile again.
    (source / "agent" / "more.py").write_text("Y = 2\n")
    assert not bytecode.is_warm(("agent",))
