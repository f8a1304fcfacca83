"""What a running stack records about itself in ``<state-dir>/state.json``.

Every ``dev`` verb reads this file, so ``dev status`` and ``dev down`` work from any shell
and two stacks with different state directories never touch each other.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec


class ComponentState(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    kind: str
    pid: int
    start_ticks: int
    log: str
    ports: dict[str, int] = msgspec.field(default_factory=dict)
    #: When it was started (Unix time) and how long after that it was first ready.
    started_at: float = 0.0
    ready_seconds: float | None = None
    #: How it was started (``dev restart`` starts it again the same way); empty for a
    #: process the stack did not start itself.
    argv: tuple[str, ...] = ()
    env: dict[str, str] = msgspec.field(default_factory=dict)
    #: Forked by the agent zygote (``stack.zygote``) rather than started with ``argv``:
    #: ``argv`` still says what it runs, and ``dev restart`` forks it again while the
    #: zygote runs.
    forked: bool = False


class StackState(msgspec.Struct, frozen=True, kw_only=True):
    version: int = 1
    k8s_version: str
    fleet: str
    kubeconfig: str
    apiserver: str
    nats_url: str
    components: tuple[ComponentState, ...] = ()


def state_file(state_dir: Path) -> Path:
    return state_dir / "state.json"


def load(state_dir: Path) -> StackState | None:
    """The recorded state, or None when no stack was ever started here."""
    try:
        data = state_file(state_dir).read_bytes()
    except FileNotFoundError:
        return None
    return msgspec.json.decode(data, type=StackState)


def save(state_dir: Path, state: StackState) -> None:
    path = state_file(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(state)))
    os.replace(tmp, path)


def clear(state_dir: Path) -> None:
    state_file(state_dir).unlink(missing_ok=True)
