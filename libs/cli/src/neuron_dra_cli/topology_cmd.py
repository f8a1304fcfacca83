"""``neuron-dra topology show NODE``: a node's Neuron devices as they are linked, with the
claim holding each one.

The picture comes from what the cluster says: the node's pool of ResourceSlices (devices and
their topology attributes) and the ResourceClaims allocated from it. A trn node is drawn as
its 4x4 torus (rows wrap, columns wrap), an inf2 node as its ring or line::

    trn2-48xl-0  trn2.48xlarge  pool generation 1  (16 devices, 8 held)

         col 0  col 1  col 2  col 3
    row 0 [ 0 A]-[ 1 A]-[ 2 A]-[ 3 A]  ↺
    row 1 [ 4 B]-[ 5 B]-[ 6 B]-[ 7 B]  ↺
    ...
      A  default/pod0-neurons-x7k2p
"""

from __future__ import annotations

import argparse
import json
import os
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from neuron_dra_common.driver import DRIVER_NAME as DRIVER

from neuron_dra_cli import paths
from neuron_dra_cli.errors import CliError

__all__ = ["holders", "register", "render"]


Obj = dict[str, Any]
_MARKS = string.ascii_uppercase + string.ascii_lowercase + string.digits


def _attr(device: Obj, name: str) -> Any:
    value = (device.get("attributes") or {}).get(name) or {}
    return next(iter(value.values()), None) if value else None


def current_devices(slices: Sequence[Obj], node: str) -> tuple[int, list[Obj]]:
    """The devices of ``node``'s pool at its newest generation, in slice order."""
    mine = [
        s
        for s in slices
        if s["spec"].get("driver") == DRIVER and s["spec"].get("pool", {}).get("name") == node
    ]
    if not mine:
        return 0, []
    top = max(s["spec"]["pool"]["generation"] for s in mine)
    devices = [
        d
        for s in mine
        if s["spec"]["pool"]["generation"] == top
        for d in s["spec"].get("devices") or []
    ]
    return int(top), devices


def holders(claims: Sequence[Obj], node: str) -> dict[str, str]:
    """Device name -> ``namespace/claim`` for every claim allocated from ``node``'s pool."""
    held: dict[str, str] = {}
    for claim in claims:
        results = (
            claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results") or []
        )
        meta = claim["metadata"]
        for r in results:
            if r.get("driver") == DRIVER and r.get("pool") == node:
                held[r["device"]] = f"{meta.get('namespace', '')}/{meta['name']}"
    return held


def _cell(index: int, mark: str) -> str:
    return f"[{index:>2} {mark or '.'}]"


def render(*, node: str, slices: Sequence[Obj], claims: Sequence[Obj]) -> str:
    """The picture of ``node`` as text (see the module docstring)."""
    generation, devices = current_devices(slices, node)
    if not devices:
        raise CliError(f"node {node}: no {DRIVER} ResourceSlices (is discovery running there?)")
    held = holders(claims, node)
    owners = sorted(set(held.values()))
    marks = {owner: _MARKS[i % len(_MARKS)] for i, owner in enumerate(owners)}
    chips = {
        int(_attr(d, "deviceId")): d for d in devices if _attr(d, "resourceType") == "neuron_device"
    }
    node_devices = [d for d in devices if _attr(d, "resourceType") == "neuron_node"]
    itype = next(
        (str(_attr(d, "nodeInstanceType") or _attr(d, "instanceType")) for d in devices), "?"
    )
    lines = [
        f"{node}  {itype}  pool generation {generation}  "
        f"({len(chips)} devices, {sum(1 for d in chips.values() if d['name'] in held)} held)",
        "",
    ]

    def mark(device: Obj) -> str:
        owner = held.get(device["name"])
        return marks[owner] if owner else ""

    if chips and all(_attr(d, "topology_x") is not None for d in chips.values()):
        grid: dict[tuple[int, int], int] = {
            (int(_attr(d, "topology_x")), int(_attr(d, "topology_y"))): i for i, d in chips.items()
        }
        cols = max(c for _, c in grid) + 1
        lines.append("      " + "  ".join(f"col {c}" for c in range(cols)))
        for row in range(max(r for r, _ in grid) + 1):
            cells = [
                _cell(grid[(row, c)], mark(chips[grid[(row, c)]])) if (row, c) in grid else "[    ]"
                for c in range(cols)
            ]
            lines.append(f"row {row} " + "-".join(cells) + "  ↺")
        lines.append("      " + "   ".join("  ↕  " for _ in range(cols)) + "  (columns wrap)")
    else:
        ids = sorted(chips)
        linked = len(ids) > 2 and itype.startswith(("inf2.48", "inf1"))
        chain = "-".join(_cell(i, mark(chips[i])) for i in ids)
        lines.append(chain + ("  ↺ (ring)" if linked else ""))
    for d in node_devices:
        owner = held.get(d["name"])
        state = f"held by {marks[owner]}" if owner else "free"
        lines.append(f"node device {d['name']} (whole node): {state}")
    lines.append("")
    if owners:
        lines += [f"  {marks[o]}  {o}" for o in owners]
    else:
        lines.append("  no claims hold devices of this node")
    return "\n".join(lines)


def _kubeconfig(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    if os.environ.get("KUBECONFIG"):
        return Path(os.environ["KUBECONFIG"])
    local = paths.default_state_dir() / "kubeconfig"
    if local.exists():
        return local
    raise CliError("no kubeconfig: pass --kubeconfig, set KUBECONFIG, or start `neuron-dra dev up`")


def _get(kubeconfig: Path, *args: str) -> list[Obj]:
    from neuron_dra_cli.stack import kubectl

    try:
        proc = kubectl.run(kubeconfig, ["get", *args, "-o", "json"])
    except RuntimeError as exc:
        raise CliError(str(exc)) from None
    items: list[Obj] = json.loads(proc.stdout).get("items", [])
    return items


def _show(args: argparse.Namespace) -> int:
    kubeconfig = _kubeconfig(args.kubeconfig)
    slices = _get(kubeconfig, "resourceslices")
    claims = _get(kubeconfig, "resourceclaims", "--all-namespaces")
    print(render(node=args.node, slices=slices, claims=claims))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    topo = sub.add_parser(
        "topology",
        help="show how a node's Neuron devices are linked and who holds them",
        description="Views of the Neuron device topology as the cluster publishes it.",
    )
    verbs = topo.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    show = verbs.add_parser(
        "show", help="draw NODE's devices (torus or ring) and the claims holding them"
    )
    show.add_argument("node", metavar="NODE", help="node name (its pool has the same name)")
    show.add_argument(
        "--kubeconfig",
        help="kubeconfig (default: KUBECONFIG, else the local stack's)",
    )
    show.set_defaults(handler=_show)
