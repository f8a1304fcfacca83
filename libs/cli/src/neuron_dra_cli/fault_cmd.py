"""``neuron-dra dev fault``: make a simulated node of the local stack fail like real hardware.

Hardware faults change the node's simulated files exactly as the Neuron driver would show
them (kernel log line, counter, link); the node's health probe notices them like on a real
node. ``lost`` is the node dying: its kubelet and agents are killed (SIGKILL, no goodbye).
"""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

from neuron_dra_common.hardware.simulate import FAULTS, FaultError, inject_fault

from neuron_dra_cli import paths
from neuron_dra_cli.errors import CliError
from neuron_dra_cli.stack import process, state
from neuron_dra_cli.stack.layout import Layout

__all__ = ["LOST", "apply_fault", "node_processes", "register"]

LOST = "lost"
#: The per-node components of the stack, by the prefix of their name.
_NODE_COMPONENTS = (
    "node-",
    "kubelet-",  # a real node's kubelet
    "discovery-",
    "kubelet-plugin-",
    "device-plugin-",
    "health-probe-",
)


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = verbs.add_parser(
        "fault",
        help="inject a hardware fault into a simulated node (or repair it)",
        description="Make a simulated Neuron node of the local stack fail as real hardware "
        "does. sram, nc, hbm, dma: an uncorrectable error (the driver's NEURON_HW_ERR "
        "kernel log line, and its counter where the driver keeps one); hbm-repairable: a repairable HBM error (its "
        "counter); link-down: a NeuronLink of the device goes down; lost: the node's "
        "kubelet and agents are killed (kill -9); repair: a driver reload (counters at "
        "zero, links back) of the device, or of every device without --device. A lost node "
        "comes back only with a new `dev up`.",
    )
    p.add_argument("node", metavar="NODE")
    p.add_argument(
        "fault", metavar="FAULT", choices=(*FAULTS, LOST), help=" | ".join((*FAULTS, LOST))
    )
    p.add_argument("--device", type=int, default=None, help="device index (default 0)")
    p.add_argument("--core", type=int, default=0, help="NeuronCore on the device (default 0)")
    paths.add_state_dir_option(p)
    p.set_defaults(handler=cmd_fault)


def node_processes(current: state.StackState, node: str) -> list[state.ComponentState]:
    """The stack's processes that make up ``node``: its kubelet and its agents."""
    names = {prefix + node for prefix in _NODE_COMPONENTS}
    return [c for c in current.components if c.name in names]


def cmd_fault(args: argparse.Namespace) -> int:
    state_dir = (
        Path(args.state_dir).expanduser().resolve() if args.state_dir else paths.default_state_dir()
    )
    for line in apply_fault(
        state_dir, node=args.node, fault=args.fault, device=args.device, core=args.core
    ):
        print(f"{args.node}: {line}")
    return 0


def apply_fault(
    state_dir: Path, *, node: str, fault: str, device: int | None = None, core: int = 0
) -> list[str]:
    """Make ``node`` of the stack under ``state_dir`` show ``fault``; what changed, in words.

    The one way a fault is made, for this command and for the ``recovery`` benchmark (which
    times from the moment it returns).

    >>> apply_fault(state_dir, node="trn2-48xl-0", fault="lost")
    ['killed node-trn2-48xl-0 (pid 4242), discovery-trn2-48xl-0 (pid 4250), ...']
    """
    current = state.load(state_dir)
    if current is None:
        raise CliError(f"no stack recorded under {state_dir}; start one with `neuron-dra dev up`")
    members = node_processes(current, node)
    if not members:
        raise CliError(f"node {node!r} is not a node of the stack under {state_dir}")
    if fault == LOST:
        killed = []
        for c in members:
            running = process.Running(pid=c.pid, start_ticks=c.start_ticks)
            if process.alive(running):
                process.kill_group(running, signal.SIGKILL)
                killed.append(f"{c.name} (pid {c.pid})")
        return [f"killed {', '.join(killed) if killed else 'nothing (already down)'}"]
    root = Layout(state_dir).node_dir(node) / "hw"
    if not (root / "sys").is_dir():
        raise CliError(f"node {node!r} has no simulated Neuron hardware under {root}")
    try:
        return inject_fault(root, fault=fault, node_name=node, device=device, core=core)
    except FaultError as exc:
        raise CliError(str(exc)) from None
