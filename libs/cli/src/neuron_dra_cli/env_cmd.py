"""``neuron-dra dev env POD``: what a pod's containers get from their Neuron (and EFA) claims.

For each container and each claim it uses, the CDI device ids the plugin answered, resolved
against the CDI spec files the node's plugin wrote: the device nodes and the environment
(printed as ``export`` lines, as AWS's Neuron DRA driver guide shows them inside the
container).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_dra_common import cdi
from neuron_dra_common.driver import ANNOTATION_REQUESTS
from neuron_dra_common.efa import EFA_CDI_KIND

from neuron_dra_cli import paths
from neuron_dra_cli.errors import CliError
from neuron_dra_cli.output import add_output_option
from neuron_dra_cli.stack import kubectl, state
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_cli.stack.plugin import cdi_root

__all__ = ["ContainerView", "as_json", "cmd_env", "register", "resolve"]

_KINDS = (cdi.NEURON_CDI_KIND, EFA_CDI_KIND)


@dataclass
class ContainerView:
    """What one container gets: CDI ids, device nodes (path, host path) and environment."""

    name: str
    claims: list[str] = field(default_factory=list)
    cdi_ids: list[str] = field(default_factory=list)
    device_nodes: list[tuple[str, str]] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = verbs.add_parser(
        "env",
        help="print the devices and environment a pod's containers get from their claims",
    )
    p.add_argument("pod", metavar="POD")
    p.add_argument("-n", "--namespace", default="default")
    paths.add_state_dir_option(p)
    add_output_option(p)
    p.set_defaults(handler=cmd_env)


def _get(kubeconfig: Path, *args: str) -> dict[str, Any]:
    proc = kubectl.run(kubeconfig, ["get", *args, "-o", "json"], check=False)
    if proc.returncode != 0:
        raise CliError(proc.stderr.strip() or f"kubectl get {' '.join(args)} failed")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def _claim_names(pod: dict[str, Any]) -> dict[str, str]:
    """Pod claim name -> ResourceClaim name."""
    names = {
        c["name"]: c["resourceClaimName"]
        for c in pod["spec"].get("resourceClaims", [])
        if c.get("resourceClaimName")
    }
    for s in pod.get("status", {}).get("resourceClaimStatuses", []):
        if s.get("resourceClaimName"):
            names[s["name"]] = s["resourceClaimName"]
    return names


def _matches(device: cdi.Device, request: str) -> bool:
    if not request:
        return True
    return request in device.annotations.get(ANNOTATION_REQUESTS, "").split(",")


def resolve(
    pod: dict[str, Any], claims: dict[str, dict[str, Any]], spec_root: Path
) -> list[ContainerView]:
    """Each container's view, from the pod, its claims (by pod claim name) and the specs."""
    views: list[ContainerView] = []
    namespace = pod["metadata"]["namespace"]
    for container in pod["spec"]["containers"]:
        view = ContainerView(name=container["name"])
        env: dict[str, str] = {}
        for use in container.get("resources", {}).get("claims", []):
            claim = claims.get(use["name"])
            if claim is None:
                view.problems.append(f"claim {use['name']}: no ResourceClaim yet")
                continue
            meta = claim["metadata"]
            view.claims.append(f"{use['name']} (ResourceClaim {namespace}/{meta['name']})")
            # The Neuron plugin's spec, and the simulated EFA driver's where it prepared the
            # claim's EFA interfaces (both write to the node's CDI root).
            specs = [
                spec
                for kind in _KINDS
                if (spec := cdi.read_claim_spec(spec_root, meta["uid"], kind)) is not None
            ]
            if not specs:
                view.problems.append(
                    f"ResourceClaim {namespace}/{meta['name']}: no CDI spec in {spec_root} "
                    "(not prepared on this node, or not by neuron.aws.com)"
                )
                continue
            for spec in specs:
                for device in spec.devices:
                    if not _matches(device, use.get("request", "")):
                        continue
                    view.cdi_ids.append(cdi.qualified_device_id(device.name, spec.kind))
                    for node in device.container_edits.device_nodes:
                        view.device_nodes.append((node.path, node.host_path or node.path))
                    for entry in device.container_edits.env:
                        key, _, value = entry.partition("=")
                        env[key] = value
                for entry in spec.container_edits.env:
                    key, _, value = entry.partition("=")
                    env[key] = value
        view.env = [f"{k}={v}" for k, v in sorted(env.items())]
        views.append(view)
    return views


def as_json(namespace: str, pod: dict[str, Any], views: list[ContainerView]) -> dict[str, Any]:
    """The ``-o json`` document: the pod, its node, and what each container gets."""
    return {
        "pod": f"{namespace}/{pod['metadata']['name']}",
        "node": pod["spec"].get("nodeName", ""),
        "phase": pod.get("status", {}).get("phase", ""),
        "containers": [
            {
                "name": v.name,
                "claims": v.claims,
                "cdiDevices": v.cdi_ids,
                "deviceNodes": [{"path": path, "hostPath": host} for path, host in v.device_nodes],
                "env": dict(entry.partition("=")[::2] for entry in v.env),
                "problems": v.problems,
            }
            for v in views
        ],
    }


def _state_dir(args: argparse.Namespace) -> Path:
    if args.state_dir:
        return Path(args.state_dir).expanduser().resolve()
    return paths.default_state_dir()


def cmd_env(args: argparse.Namespace) -> int:
    state_dir = _state_dir(args)
    current = state.load(state_dir)
    if current is None:
        raise CliError(f"no stack in {state_dir}; start one with `neuron-dra dev up`")
    kubeconfig = Path(current.kubeconfig)
    pod = _get(kubeconfig, "pod", args.pod, "-n", args.namespace)
    node = pod["spec"].get("nodeName")
    if not node:
        raise CliError(f"pod {args.namespace}/{args.pod}: not scheduled to a node yet")
    claims = {
        name: _get(kubeconfig, "resourceclaim", claim, "-n", args.namespace)
        for name, claim in _claim_names(pod).items()
    }
    views = resolve(pod, claims, cdi_root(Layout(state_dir), node))
    if args.output == "json":
        print(json.dumps(as_json(args.namespace, pod, views), indent=2))
        return 1 if any(v.problems for v in views) else 0
    print(f"pod {args.namespace}/{args.pod} on node {node} ({pod['status'].get('phase')})")
    for view in views:
        print(f"container {view.name}")
        for claim in view.claims:
            print(f"  claim {claim}")
        for cdi_id in view.cdi_ids:
            print(f"  cdi {cdi_id}")
        for path, host in view.device_nodes:
            print(f"  device {path}" + (f" (host {host})" if host != path else ""))
        for entry in view.env:
            key, _, value = entry.partition("=")
            print(f'  export {key}="{value}"')
        for problem in view.problems:
            print(f"  ! {problem}")
    return 1 if any(v.problems for v in views) else 0
