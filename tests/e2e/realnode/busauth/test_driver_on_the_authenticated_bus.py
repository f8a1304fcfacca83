"""The driver's DaemonSets on a real node, on the authenticated bus (``dev up --real-nodes 1
--real-node-driver --bus-auth``).

The stack's kustomization lists the bus-auth component, as a cluster's overlay would: the
real kubelet projects each agent's ServiceAccount token (audience ``neuron-dra-bus``, bound to
its pod, so it names the node) and NATS's CA from the Secret ``neuron-dra-nats-tls`` into the
containers, and the auth callout admits them with their node's grants. Everything the plain
real-node tests show still holds; a container on the same node without a token of a bus
identity is turned away.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from neuron_dra_cli.stack import busauth, realdriver

from tests.e2e.realnode.conftest import REAL_NODE
from tests.e2e.realnode.test_driver_on_real_node import (
    NAMESPACE,
    a_pod_gets_four_connected_devices,
    driver_image,
    driver_runs_on_the_real_node_only,
    real_slice_lists_its_16_devices,
)
from tests.fixtures.stack import KubeStack

INTRUDERS = "real-node-intruders"


def callout_log(stack: KubeStack) -> list[dict[str, Any]]:
    """The auth callout's log (a process of the stack), one JSON record a line."""
    text = (stack.state_dir / "logs" / f"{busauth.KIND}.log").read_text(errors="replace")
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _mount(stack: KubeStack, daemonset: str) -> dict[str, Any]:
    """What the agent's container reads its bus credentials from."""
    spec = stack.get_json("daemonset", daemonset, "-n", NAMESPACE)["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    volume = next(v for v in spec["volumes"] if v["name"] == "bus-token")
    return {
        "token": env.get("NEURON_DRA_NATS_TOKEN_FILE"),
        "ca": env.get("NEURON_DRA_NATS_TLS_CA"),
        "sources": volume["projected"]["sources"],
    }


def test_the_agents_run_on_the_real_node_with_their_projected_bus_tokens(
    real_bus_auth_stack: KubeStack,
) -> None:
    stack = real_bus_auth_stack
    driver_runs_on_the_real_node_only(stack)
    for daemonset in realdriver.DAEMONSETS:
        assert _mount(stack, daemonset) == {
            "token": "/var/run/secrets/neuron-dra/bus/token",
            "ca": "/var/run/secrets/neuron-dra/bus/ca.crt",
            "sources": [
                {
                    "serviceAccountToken": {
                        "audience": busauth.AUDIENCE,
                        "expirationSeconds": 3600,
                        "path": "token",
                    }
                },
                {
                    "secret": {
                        "name": realdriver.NATS_TLS_SECRET,
                        "items": [{"key": "ca.crt", "path": "ca.crt"}],
                    }
                },
            ],
        }
    # The callout admitted each agent as itself on its node: the node is the one the
    # kubelet's pod-bound token names, not one the client claimed.
    admitted = {
        r.get("identity"): r.get("service_account")
        for r in callout_log(stack)
        if r.get("message") == "auth callout: admitted"
    }
    assert admitted.get(f"discovery@{REAL_NODE}") == f"{NAMESPACE}/neuron-dra-discovery"
    assert admitted.get(f"kubelet-plugin@{REAL_NODE}") == f"{NAMESPACE}/neuron-dra-kubelet-plugin"


def test_the_real_nodes_resource_slice_is_published_from_the_authenticated_bus(
    real_bus_auth_stack: KubeStack,
) -> None:
    real_slice_lists_its_16_devices(real_bus_auth_stack)


def test_a_pod_gets_its_four_connected_devices_in_a_real_container(
    real_bus_auth_stack: KubeStack,
) -> None:
    a_pod_gets_four_connected_devices(real_bus_auth_stack)


# Beside the agents on the real node, with NATS's CA (so TLS succeeds and only the token is
# judged): first no token, then a token of its own ServiceAccount for the bus's audience.
_INTRUDER = """
import asyncio, ssl, sys
import nats

async def attempt(label, token):
    client = nats.aio.client.Client()
    try:
        await client.connect(
            sys.argv[1], token=token, allow_reconnect=False, max_reconnect_attempts=0,
            connect_timeout=5, tls=ssl.create_default_context(cafile="/bus/ca.crt"),
        )
        print(label, "admitted", flush=True)
    except Exception as exc:
        print(label, "refused:", str(exc).lower(), flush=True)
    finally:
        await client.close()

async def main():
    await attempt("no-token", None)
    await attempt("own-token", open("/bus/token").read())

asyncio.run(main())
"""


def _intruder(*, image: str, nats_url: str, ca_pem: str) -> list[dict[str, Any]]:
    ca = realdriver.NATS_TLS_SECRET
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": ca, "namespace": INTRUDERS},
            "data": {"ca.crt": ca_pem},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "intruder", "namespace": INTRUDERS},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": REAL_NODE},
                # Where the agents are: NATS listens on the host's loopback.
                "hostNetwork": True,
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": image,
                        "imagePullPolicy": "Never",
                        "command": ["python3", "-c", _INTRUDER, nats_url],
                        "volumeMounts": [{"name": "bus", "mountPath": "/bus"}],
                    }
                ],
                "volumes": [
                    {
                        "name": "bus",
                        "projected": {
                            "sources": [
                                {
                                    "serviceAccountToken": {
                                        "audience": busauth.AUDIENCE,
                                        "path": "token",
                                    }
                                },
                                {"configMap": {"name": ca}},
                            ]
                        },
                    }
                ],
            },
        },
    ]


def test_a_container_without_a_bus_identity_is_refused(real_bus_auth_stack: KubeStack) -> None:
    stack = real_bus_auth_stack
    stack.create_namespace(INTRUDERS)
    # The CA is public: what the intruder lacks is a token of a bus identity.
    secret = stack.get_json("secret", realdriver.NATS_TLS_SECRET, "-n", NAMESPACE)
    ca_pem = base64.b64decode(secret["data"]["ca.crt"]).decode()
    objects = _intruder(image=driver_image(stack), nats_url=stack.nats_url, ca_pem=ca_pem)
    stack.kubectl("apply", "-f", "-", input=json.dumps({"kind": "List", "apiVersion": "v1",
                                                         "items": objects}))  # fmt: skip

    def phase() -> str:
        return str(stack.get_json("pod", "intruder", "-n", INTRUDERS)["status"].get("phase", ""))

    assert stack.wait_for("the intruder to finish", lambda: phase() in ("Succeeded", "Failed"),
                          timeout=120)  # fmt: skip
    assert phase() == "Succeeded"
    logs = stack.kubectl("logs", "intruder", "-n", INTRUDERS).stdout
    # Its verdicts (the NATS client and asyncio may warn on stderr besides).
    lines = [line for line in logs.splitlines() if line.startswith(("no-token ", "own-token "))]
    assert [line.split(":")[0] for line in lines] == ["no-token refused", "own-token refused"], logs
    assert all("authorization violation" in line for line in lines), logs
    reasons = [
        r.get("reason", "")
        for r in callout_log(stack)
        if r.get("message") == "auth callout: refused"
    ]
    assert any(r.startswith("no token") for r in reasons), reasons
    assert f"ServiceAccount {INTRUDERS}/default has no bus identity" in reasons, reasons
