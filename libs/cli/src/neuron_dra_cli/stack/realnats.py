"""NATS from the base's StatefulSet on the real node (``dev up --real-nodes 1 --real-node-driver``).

The bus every service talks over runs as the ``nats`` StatefulSet of
``deploy/kustomize/overlays/local`` (the base's configuration, JetStream on the pod's volume,
its probes and preStop hook), in a container of the image built from the pinned nats-server
binary (``natsimage``), instead of a process of the stack. The stack patches only what this
machine needs, in a kustomization of its own beside the overlay:

- the node: the real one, on the host's network, so that every client of the stack (the
  simulated nodes' agents, the services, the tests) reaches it at the loopback address and
  ports the stack chose, as it would reach the stack's own server;
- the ports: the server's arguments name them (command-line flags take precedence over the
  configuration file), and the container's ports follow;
- the volume: the stack has no storage provisioner, so it makes the PersistentVolume the
  StatefulSet's claim ``data-nats-0`` binds to, as a cluster's administrator would: a folder
  of the real node's, owned by the server's user, with the claim's size (both read from the
  rendered StatefulSet).

It starts once the real node is Ready and before any service: nothing of the stack uses the
bus before then. Only on the open bus (``--insecure-bus``): the authenticated one (the
default) keeps the stack's own server, whose configuration is the stack's, made with the auth
callout's keys; here the StatefulSet runs with nats.conf alone.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Final

import yaml

from neuron_dra_cli.errors import CliError
from neuron_dra_cli.stack import kubectl, realconfig, realdriver, realnodes
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_cli.toolbuild import ContainerdBinaries

__all__ = ["STATEFULSET", "apply", "kustomization", "render", "volume"]

STATEFULSET: Final = "nats"


def kustomization(*, folder: Path, port: int, monitor_port: int) -> str:
    """The stack's kustomization (JSON, which is YAML) in ``folder``: the local overlay with
    the StatefulSet on the real node's network at ``port`` (clients) and ``monitor_port``."""
    placement = realdriver.workload_patch(
        "StatefulSet",
        STATEFULSET,
        {
            "nodeSelector": {realconfig.REAL_NODE_LABEL: "true"},
            "hostNetwork": True,
            "dnsPolicy": "ClusterFirstWithHostNet",
            # The open bus (--insecure-bus): nats.conf alone (the arguments below), without
            # the callout's keys and the certificate the base's auth.conf reads.
            "containers": [
                {
                    "name": "nats",
                    "env": [
                        {"name": "NEURON_DRA_BUS_AUTH_ISSUER", "$patch": "delete"},
                        {"name": "NEURON_DRA_BUS_AUTH_PASSWORD", "$patch": "delete"},
                    ],
                    "volumeMounts": [{"mountPath": "/etc/nats-tls", "$patch": "delete"}],
                }
            ],
            "volumes": [{"name": "tls", "$patch": "delete"}],
            # It keeps its streams in the global account, where an open server has them.
            "initContainers": [{"name": "streams-to-account", "$patch": "delete"}],
        },
    )
    ports = [
        {"op": "replace", "path": "/spec/template/spec/containers/0/args",
         "value": ["--config", "/etc/nats/nats.conf", "--port", str(port),
                   "--http_port", str(monitor_port)]},
        {"op": "replace", "path": "/spec/template/spec/containers/0/ports",
         "value": [{"name": "client", "containerPort": port},
                   {"name": "monitor", "containerPort": monitor_port}]},
        # The probes ask the monitoring port on the loopback (the overlay's URL is the last
        # argument of each), here the stack's.
        *({"op": "replace", "path": f"/spec/template/spec/containers/0/{probe}/exec/command/3",
           "value": f"http://127.0.0.1:{monitor_port}/healthz{query}"}
          for probe, query in (("startupProbe", "?js-enabled-only=true"),
                               ("livenessProbe", "?js-enabled-only=true"),
                               ("readinessProbe", ""))),
    ]  # fmt: skip
    doc = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(realdriver.LOCAL_OVERLAY.resolve(), folder.resolve())],
        "patches": [
            {"target": {"kind": "StatefulSet", "name": STATEFULSET}, "patch": placement},
            {"target": {"kind": "StatefulSet", "name": STATEFULSET}, "patch": json.dumps(ports)},
        ],
    }  # fmt: skip
    return json.dumps(doc, indent=2) + "\n"


def _wanted(obj: dict[str, Any]) -> bool:
    """The StatefulSet and the configuration it mounts (named by its contents' hash)."""
    kind, name = obj.get("kind"), str(obj.get("metadata", {}).get("name", ""))
    return (kind == "StatefulSet" and name == STATEFULSET) or (
        kind == "ConfigMap" and name.startswith("nats-config")
    )


def render(kubeconfig: Path, folder: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize folder``, cut down to the StatefulSet and its ConfigMap."""
    out = kubectl.run(kubeconfig, ["kustomize", str(folder)]).stdout
    return [d for d in yaml.safe_load_all(out) if d and _wanted(d)]


def volume(statefulset: dict[str, Any], path: Path) -> dict[str, Any]:
    """The PersistentVolume of ``statefulset``'s one claim (its one claim template, for its
    pod 0): ``path`` on the real node, with the template's size and access modes, reserved
    for that claim (``claimRef``) so that no other claim takes it, kept when it is released
    (the stack's ``dev down`` removes the node's folder)."""
    [template] = statefulset["spec"]["volumeClaimTemplates"]
    claim = f"{template['metadata']['name']}-{statefulset['metadata']['name']}-0"
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"neuron-dra-{claim}"},
        "spec": {
            "capacity": {"storage": template["spec"]["resources"]["requests"]["storage"]},
            "accessModes": template["spec"]["accessModes"],
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"namespace": realdriver.NAMESPACE, "name": claim},
            "hostPath": {"path": str(path.resolve()), "type": "Directory"},
        },
    }


def apply(
    *,
    layout: Layout,
    kubeconfig: Path,
    binaries: ContainerdBinaries,
    image: str,
    node: str,
    port: int,
    monitor_port: int,
    timeout: float = 120.0,
) -> None:
    """Import the NATS ``image`` into ``node``'s containerd, make the volume, apply the
    StatefulSet with its configuration, and wait until its pod is Ready and the server
    answers at ``port`` on the loopback address."""
    realdriver.import_product_image(image=image, binaries=binaries, layout=layout, nodes=[node])
    folder = layout.root / "real-node-nats"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kustomization.yaml").write_text(
        kustomization(folder=folder, port=port, monitor_port=monitor_port)
    )
    objects = render(kubeconfig, folder)
    if sorted(o["kind"] for o in objects) != ["ConfigMap", "StatefulSet"]:
        raise CliError(
            f"{realdriver.LOCAL_OVERLAY}: expected the nats StatefulSet and its ConfigMap, "
            f"rendered {[(o['kind'], o['metadata']['name']) for o in objects]}"
        )
    for obj in objects:
        obj.setdefault("metadata", {}).setdefault("namespace", realdriver.NAMESPACE)
    [statefulset] = [o for o in objects if o["kind"] == "StatefulSet"]
    # Owned by the server's user and group: a hostPath volume gets no fsGroup.
    pod_security = statefulset["spec"]["template"]["spec"]["securityContext"]
    data = realnodes.node_paths(layout, node).base / "nats-data"
    data.mkdir(parents=True, exist_ok=True)
    os.chown(data, pod_security["runAsUser"], pod_security["runAsGroup"])
    items = [volume(statefulset, data), *objects]
    kubectl.run(
        kubeconfig,
        ["apply", "-f", "-"],
        input=json.dumps({"kind": "List", "apiVersion": "v1", "items": items}),
    )
    realdriver.wait_ready(kubeconfig, workloads=(STATEFULSET,), nodes=(node,), timeout=timeout)
    _wait_port(port, timeout=30.0)


def _wait_port(port: int, *, timeout: float) -> None:
    from neuron_dra_cli.stack import probes

    deadline = time.monotonic() + timeout
    while not probes.tcp_open(port):
        if time.monotonic() > deadline:
            raise CliError(f"NATS on the real node does not accept connections at :{port}")
        time.sleep(0.2)
