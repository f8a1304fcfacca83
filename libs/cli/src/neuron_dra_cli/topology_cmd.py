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

A device with a DRA device taint (the health monitor's ``neuron.aws.com/hardware-error``, or
a lost node's ``neuron.aws.com/node-lost``) is flagged beside its number: ``!`` for
``NoExecute`` (uncorrectable: its pods are evicted), ``~`` for ``NoSchedule`` (degraded: no
new claims), and listed under the picture with its taints.

On an UltraServer node a claim on the whole-node device ``neuronnode`` holds all the node's
devices: each is drawn held by that claim. ``-o json`` prints the same view as one document.
"""

from __future__ import annotations

import argparse
import json
import os
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from neuron_dra_common.driver import DEVICE_RESOURCE_TYPE, NODE_RESOURCE_TYPE
from neuron_dra_common.driver import DRIVER_NAME as DRIVER

from neuron_dra_cli import paths
from neuron_dra_cli.aio import run
from neuron_dra_cli.errors import CliError
from neuron_dra_cli.output import add_output_option

__all__ = ["holders", "register", "render", "view"]


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
    """Device name -> ``namespace/claim`` for every claim allocated from ``node``'s pool.

    A device allocated with admin access (a monitoring pod's) is not held by that claim."""
    held: dict[str, str] = {}
    for claim in claims:
        results = (
            claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results") or []
        )
        meta = claim["metadata"]
        for r in results:
            if r.get("driver") == DRIVER and r.get("pool") == node and not r.get("adminAccess"):
                held[r["device"]] = f"{meta.get('namespace', '')}/{meta['name']}"
    return held


def _cell(index: int, mark: str, flag: str = " ") -> str:
    return f"[{index:>2}{flag}{mark or '.'}]"


def _taints(device: Obj) -> list[Obj]:
    return [
        {"key": t.get("key", ""), "value": t.get("value", ""), "effect": t.get("effect", "")}
        for t in device.get("taints") or []
    ]


def _flag(taints: Sequence[Obj]) -> str:
    effects = {t["effect"] for t in taints}
    if "NoExecute" in effects:
        return "!"
    if "NoSchedule" in effects:
        return "~"
    return " "


def _taint_text(taints: Sequence[Obj]) -> str:
    return ", ".join(
        f"{t['key']}={t['value']}:{t['effect']}" if t["value"] else f"{t['key']}:{t['effect']}"
        for t in taints
    )


def _held_through_node_device(
    held: dict[str, str], chips: dict[int, Obj], node_devices: Sequence[Obj]
) -> dict[int, str]:
    """Chip index -> holder, counting a claim on the whole-node device as holding every chip."""
    whole = next((held[d["name"]] for d in node_devices if d["name"] in held), None)
    out = {i: held[d["name"]] for i, d in chips.items() if d["name"] in held}
    if whole is not None:
        out.update({i: whole for i in chips if i not in out})
    return out


def view(*, node: str, slices: Sequence[Obj], claims: Sequence[Obj]) -> Obj:
    """What ``topology show`` reports about ``node``, as plain data (the ``-o json`` output).

    A claim on the whole-node device (``neuronnode``) holds every Neuron device of the node,
    so each device is reported held by it.
    """
    generation, devices = current_devices(slices, node)
    if not devices:
        raise CliError(f"node {node}: no {DRIVER} ResourceSlices (is discovery running there?)")
    held = holders(claims, node)
    chips = {
        int(_attr(d, "deviceId")): d
        for d in devices
        if _attr(d, "resourceType") == DEVICE_RESOURCE_TYPE
    }
    node_devices = [d for d in devices if _attr(d, "resourceType") == NODE_RESOURCE_TYPE]
    chip_holders = _held_through_node_device(held, chips, node_devices)
    # A node that publishes only its whole-node device says how many devices it stands for.
    count = len(chips) or max((int(_attr(d, "deviceCount") or 0) for d in node_devices), default=0)
    whole_holder = next((held[d["name"]] for d in node_devices if d["name"] in held), "")
    held_count = len(chip_holders) if chips else (count if whole_holder else 0)
    itype = next(
        (str(_attr(d, "nodeInstanceType") or _attr(d, "instanceType")) for d in devices), "?"
    )
    return {
        "node": node,
        "instanceType": itype,
        "poolGeneration": generation,
        "devices": count,
        "held": held_count,
        "chips": [
            {
                "name": d["name"],
                "deviceId": i,
                "row": _attr(d, "topology_x"),
                "column": _attr(d, "topology_y"),
                "heldBy": chip_holders.get(i, ""),
                "taints": _taints(d),
            }
            for i, d in sorted(chips.items())
        ],
        "nodeDevices": [
            {"name": d["name"], "heldBy": held.get(d["name"], ""), "taints": _taints(d)}
            for d in node_devices
        ],
        "claims": sorted(set(held.values())),
    }


def render(*, node: str, slices: Sequence[Obj], claims: Sequence[Obj]) -> str:
    """The picture of ``node`` as text (see the module docstring)."""
    shown = view(node=node, slices=slices, claims=claims)
    owners: list[str] = shown["claims"]
    marks = {owner: _MARKS[i % len(_MARKS)] for i, owner in enumerate(owners)}
    chips: dict[int, Obj] = {c["deviceId"]: c for c in shown["chips"]}
    itype = str(shown["instanceType"])
    lines = [
        f"{node}  {itype}  pool generation {shown['poolGeneration']}  "
        f"({shown['devices']} devices, {shown['held']} held)",
        "",
    ]

    def mark(index: int) -> str:
        owner = chips[index]["heldBy"]
        return marks[owner] if owner else ""

    def cell(index: int) -> str:
        return _cell(index, mark(index), _flag(chips[index]["taints"]))

    if chips and all(c["row"] is not None for c in chips.values()):
        grid = {(int(c["row"]), int(c["column"])): i for i, c in chips.items()}
        cols = max(c for _, c in grid) + 1
        lines.append("      " + "  ".join(f"col {c}" for c in range(cols)))
        for row in range(max(r for r, _ in grid) + 1):
            cells = [cell(grid[(row, c)]) if (row, c) in grid else "[    ]" for c in range(cols)]
            lines.append(f"row {row} " + "-".join(cells) + "  ↺")
        lines.append("      " + "   ".join("  ↕  " for _ in range(cols)) + "  (columns wrap)")
    elif chips:
        ids = sorted(chips)
        linked = len(ids) > 2 and itype.startswith(("inf2.48", "inf1"))
        chain = "-".join(cell(i) for i in ids)
        lines.append(chain + ("  ↺ (ring)" if linked else ""))
    for d in shown["nodeDevices"]:
        owner = d["heldBy"]
        state = f"held by {marks[owner]} (all {shown['devices']} devices)" if owner else "free"
        if d["taints"]:
            state += f"; tainted {_taint_text(d['taints'])}"
        lines.append(f"node device {d['name']} (whole node): {state}")
    tainted = [c for _, c in sorted(chips.items()) if c["taints"]]
    if tainted:
        lines.append("")
        lines.append("tainted (! NoExecute, ~ NoSchedule):")
        lines += [
            f"  {_flag(c['taints'])}  {c['name']}  {_taint_text(c['taints'])}" for c in tainted
        ]
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


async def _fetch(kubeconfig: Path) -> tuple[list[Obj], list[Obj]]:
    """The cluster's ResourceSlices and (every namespace's) ResourceClaims."""
    from neuron_dra_common import kube

    client = await kube.connect(kubeconfig=kubeconfig)
    try:
        slices, _ = await client.list(kube.RESOURCE_SLICES)
        claims, _ = await client.list(kube.RESOURCE_CLAIMS)
    finally:
        await client.close()
    return slices, claims


def _show(args: argparse.Namespace) -> int:
    from neuron_dra_common.kube import ApiException, ConfigError

    kubeconfig = _kubeconfig(args.kubeconfig)
    try:
        slices, claims = run(_fetch(kubeconfig))
    except (ApiException, ConfigError, OSError) as exc:
        raise CliError(f"reading ResourceSlices and ResourceClaims ({kubeconfig}): {exc}") from None
    if args.output == "json":
        print(json.dumps(view(node=args.node, slices=slices, claims=claims), indent=2))
    else:
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
    add_output_option(show)
    show.set_defaults(handler=_show)
