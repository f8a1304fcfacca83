"""Where the command keeps its cache and the local stack's state."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

STATE_DIR_ENV = "NEURON_DRA_STATE_DIR"
CACHE_DIR_ENV = "NEURON_DRA_CACHE_DIR"


def cache_dir() -> Path:
    """The user's cache directory for neuron-dra (built binaries, downloads).

    ``$NEURON_DRA_CACHE_DIR`` wins, then ``$XDG_CACHE_HOME/neuron-dra``, then
    ``~/.cache/neuron-dra``.
    """
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "neuron-dra").resolve()


def repo_root() -> Path:
    """The checkout this command runs from (the folder holding ``tools/kube``)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "tools" / "kube" / "go.mod").is_file():
            return parent
    raise FileNotFoundError(
        "cannot find the neuron-dra checkout (tools/kube/go.mod) above " + str(here)
    )


def default_state_dir() -> Path:
    """``$NEURON_DRA_STATE_DIR`` or ``.state/stack`` in the checkout."""
    explicit = os.environ.get(STATE_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser().resolve()
    return repo_root() / ".state" / "stack"


def add_state_dir_option(parser: argparse.ArgumentParser) -> None:
    """``--state-dir``, the same for every command that works on the local stack."""
    parser.add_argument(
        "--state-dir",
        default=None,
        help=f"where the local stack keeps its state, logs and kubeconfig "
        f"(env {STATE_DIR_ENV}; default .state/stack in the checkout)",
    )
