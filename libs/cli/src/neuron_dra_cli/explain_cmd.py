"""``neuron-dra explain TARGET`` (also ``kubectl neuron explain``): why a pod is Pending.

Reads the cluster (read access is enough: the ``neuron-dra-explain-reader`` ClusterRole) and
replays kube-scheduler's DRA checks node by node: node filters, pools, DeviceClass and claim
selectors (CEL), devices held by other claims, device taints, shared counters and
``matchAttribute`` constraints. Nodes with the same reasons are shown as one group::

    Pod default/train-0: no node fits (0 of 4 nodes)
    does not fit: 3 nodes (inf2-48xl-0, trn2-48xl-1 and 1 more)
        RequestSelector: 12 of 12 devices do not pass request neurons ... selector #0 (...)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from pathlib import Path
from typing import Any, Final

from neuron_dra_cli.aio import run
from neuron_dra_cli.errors import CliError
from neuron_dra_cli.output import add_output_option

__all__ = ["context_namespace", "parse_target", "register"]

Obj = dict[str, Any]

_KINDS: Final = {
    "pod": "Pod",
    "pods": "Pod",
    "po": "Pod",
    "resourceclaim": "ResourceClaim",
    "resourceclaims": "ResourceClaim",
    "rc": "ResourceClaim",
    "neuronultraserverworkload": "NeuronUltraServerWorkload",
    "neuronultraserverworkloads": "NeuronUltraServerWorkload",
    "nusw": "NeuronUltraServerWorkload",
}
_TIMEOUT: Final = 60.0

_HELP: Final = """\
Explain why a pod (or a ResourceClaim, or a NeuronUltraServerWorkload's pods) cannot be
scheduled: kube-scheduler's DRA checks replayed on the cluster as it is now, node by node.

For each node the verdict is one of:
  fits             the scheduler can place the pod there (CPU, memory and ports are not checked)
  does not fit     with the reasons, e.g. RequestSelector, DevicesHeld, NotConnected
  scheduler error  a selector fails at run time (a missing attribute): the scheduler then
                   places the pod nowhere until the selector or the slice is fixed
  cannot tell      a feature explain does not evaluate, named in the reason

Nodes with the same reasons are shown as one group. Reason codes are stable; -o json prints
the whole explanation (schema explain.neuron.aws.com/v1) for scripts.

Read access is enough: bind the ClusterRole neuron-dra-explain-reader
(deploy/kustomize/components/explain).

examples:
  neuron-dra explain pod/train-0 -n ml
  kubectl neuron explain train-0 -n ml -o json
  kubectl neuron explain resourceclaim/shared-neurons
  kubectl neuron explain nusw/train
"""


def parse_target(text: str) -> tuple[str, str]:
    """``pod/NAME`` (or ``po/``, ``resourceclaim/``, ``rc/``, ``nusw/``...; a bare NAME is a
    pod) -> (kind, name).

    >>> parse_target("rc/shared"), parse_target("train-0")
    (('ResourceClaim', 'shared'), ('Pod', 'train-0'))
    """
    kind, slash, name = text.partition("/")
    if not slash:
        kind, name = "pod", text
    resolved = _KINDS.get(kind.lower().split(".")[0])
    if resolved is None:
        known = "pod/NAME, resourceclaim/NAME (rc/), neuronultraserverworkload/NAME (nusw/)"
        raise CliError(f"TARGET {text!r}: unknown kind {kind!r}; use {known}")
    if not name:
        raise CliError(f"TARGET {text!r}: the name after {kind}/ is empty")
    return resolved, name


def _kubeconfig(explicit: str | None) -> str:
    if explicit:
        return explicit
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"]
    from neuron_dra_cli import paths

    local = paths.default_state_dir() / "kubeconfig"
    if local.exists():
        return str(local)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return ""  # in a pod: its service account
    raise CliError("no kubeconfig: pass --kubeconfig, set KUBECONFIG, or start `neuron-dra dev up`")


def context_namespace(kubeconfig: str, context: str | None) -> str:
    """The namespace of the kubeconfig's (current) context, as kubectl defaults to it."""
    import yaml

    for path in filter(None, kubeconfig.split(os.pathsep)):
        try:
            doc = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        wanted = context or doc.get("current-context")
        for entry in doc.get("contexts") or ():
            if entry.get("name") == wanted:
                return str((entry.get("context") or {}).get("namespace") or "default")
    return "default"


async def _fetch(kubeconfig: str, context: str | None, kind: str, namespace: str, name: str) -> Any:
    """What explain reads, as a :class:`Snapshot`: read once and kept to the command's end,
    so built with the garbage collector off and frozen afterwards (at 1,000 nodes that is
    some 500,000 objects, which every full collection would otherwise walk again)."""
    from neuron_dra_common.gcpause import kept

    with kept():
        return await _read(kubeconfig, context, kind, namespace, name)


async def _read(kubeconfig: str, context: str | None, kind: str, namespace: str, name: str) -> Any:
    from neuron_dra_common import kube
    from neuron_dra_common.explain import Snapshot
    from neuron_dra_common.ultraserver import NAMESPACE as US_NAMESPACE

    group = "neuron.aws.com"
    classes = kube.Resource(
        group="resource.k8s.io", version="v1", plural="deviceclasses", kind="DeviceClass"
    )
    workloads = kube.Resource(
        group=group,
        version="v1",
        plural="neuronultraserverworkloads",
        kind="NeuronUltraServerWorkload",
        namespaced=True,
    )
    ultraservers = kube.Resource(
        group=group,
        version="v1",
        plural="neuronultraservers",
        kind="NeuronUltraServer",
        namespaced=True,
    )
    client = await kube.connect(kubeconfig=kubeconfig or None, context=context)
    try:
        target: list[Obj] = []
        pods: list[Obj] = []
        if kind == "Pod":
            target = [await client.get(kube.PODS, name, namespace=namespace)]
            pods = target
        elif kind == "ResourceClaim":
            target = [await client.get(kube.RESOURCE_CLAIMS, name, namespace=namespace)]
        else:
            target = [await client.get(workloads, name, namespace=namespace)]
            pods, _ = await client.list(
                kube.PODS, namespace=namespace, field_selector="spec.nodeName="
            )
        (
            (nodes, _),
            (slices, slices_rv),
            (claims, claims_rv),
            (device_classes, _),
            server,
        ) = await asyncio.gather(
            client.list(kube.NODES),
            client.list(kube.RESOURCE_SLICES),
            client.list(kube.RESOURCE_CLAIMS),
            client.list(classes),
            _server_version(client),
        )
        us: list[Obj] = []
        if kind == "NeuronUltraServerWorkload":
            # NeuronUltraServers live in the driver's namespace, whatever the workload's.
            us, _ = await client.list(ultraservers, namespace=US_NAMESPACE)
    finally:
        await client.close()
    # Where /version is not answered: the apiserver is at least as new as any kubelet
    # (version skew policy), so the newest kubelet is the closest lower bound the nodes tell.
    kubelet = max(
        (n.get("status", {}).get("nodeInfo", {}).get("kubeletVersion", "") for n in nodes),
        key=_version_key,
        default="",
    )
    return Snapshot.build(
        pods=pods,
        nodes=nodes,
        slices=slices,
        claims=claims,
        classes=device_classes,
        workloads=target if kind == "NeuronUltraServerWorkload" else [],
        ultraservers=us,
        server_version=server or kubelet,
        resource_versions={"resourceslices": slices_rv, "resourceclaims": claims_rv},
    )


async def _server_version(client: Any) -> str:
    """The apiserver's release, or "" when ``/version`` is refused (a cluster that took
    ``system:public-info-viewer`` away)."""
    from neuron_dra_common.kube import ApiException

    try:
        return str(await client.server_version())
    except ApiException as exc:
        if exc.status in (401, 403, 404):
            return ""
        raise


def _version_key(version: str) -> tuple[int, ...]:
    """``v1.36.3-eks-1`` -> (1, 36, 3); unparsable sorts first."""
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", version)
    return tuple(int(p or 0) for p in match.groups()) if match else ()


def _explain(args: argparse.Namespace) -> int:
    from neuron_dra_common import explain
    from neuron_dra_common.kube import ApiException, ConfigError

    kind, name = parse_target(args.target)
    kubeconfig = _kubeconfig(args.kubeconfig)
    namespace = args.namespace or context_namespace(kubeconfig, args.context)
    where = kubeconfig or "the pod's service account"
    try:
        snap = run(
            asyncio.wait_for(_fetch(kubeconfig, args.context, kind, namespace, name), _TIMEOUT)
        )
    except ApiException as exc:
        if exc.status == 404:
            raise CliError(f"{kind} {namespace}/{name} not found") from None
        if exc.status in (401, 403):
            raise CliError(
                f"not allowed to read the cluster ({where}): {exc.reason}; explain needs the "
                "read-only ClusterRole neuron-dra-explain-reader"
            ) from None
        raise CliError(f"reading the cluster ({where}): {exc}") from None
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    except (OSError, TimeoutError) as exc:
        raise CliError(f"cannot reach the cluster ({where}): {exc or type(exc).__name__}") from None
    try:
        if kind == "Pod":
            exp = explain.explain_pod(snap, namespace, name)
        elif kind == "ResourceClaim":
            exp = explain.explain_claim(snap, namespace, name)
        else:
            exp = explain.explain_workload(snap, namespace, name)
    except explain.ExplainError as exc:
        raise CliError(str(exc)) from None
    if args.output == "json":
        sys.stdout.buffer.write(explain.to_json(exp) + b"\n")
        sys.stdout.flush()
    else:
        print(explain.render_text(exp) + drawings(exp, snap), end="")
    return 0


def drawings(exp: Any, snap: Any) -> str:
    """For each group of nodes whose free devices are not connected as a request needs, the
    devices of its first node drawn as ``neuron-dra topology show`` draws them: which are
    held, by whom, and which are tainted, on the node's torus or ring."""
    from neuron_dra_cli import topology_cmd

    out = []
    for group in exp.groups:
        if not group.nodes or not any(r.code == "NotConnected" for r in group.reasons):
            continue
        node = group.nodes[0]
        try:
            picture = topology_cmd.render(node=node, slices=snap.slices, claims=snap.claims)
        except CliError:
            continue  # no Neuron pool on the node: nothing to draw
        out.append(
            f"\nThe devices of {node} (as `neuron-dra topology show {node}` draws them):\n"
            f"{picture}\n"
        )
    return "".join(out)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cmd = sub.add_parser(
        "explain",
        help="why a pod is Pending: the scheduler's DRA checks, node by node",
        description=_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument(
        "target",
        metavar="TARGET",
        help="pod/NAME (or NAME), resourceclaim/NAME (rc/), neuronultraserverworkload/NAME (nusw/)",
    )
    cmd.add_argument("-n", "--namespace", help="namespace (default: the context's, else default)")
    cmd.add_argument(
        "--kubeconfig", help="kubeconfig (default: KUBECONFIG, else the local stack's)"
    )
    cmd.add_argument("--context", help="kubeconfig context (default: the current one)")
    add_output_option(cmd)
    cmd.set_defaults(handler=_explain)
