"""``docker-compose.yml`` run as a user runs it (with podman-compose, from the dev group),
against the local stack: its cluster services (slice publisher, topology allocator,
UltraServer operator) take over from the stack's own, publish the nodes' ResourceSlices
and allocate an UltraServer workload.

The compose file's own NATS is left out by an override that points the services at the
stack's NATS (where the stack's discovery publishes the inventories) on the host's network;
the rest is the file as written: its image, commands, environment and kubeconfig mount
(``KUBECONFIG``: a kubeconfig with embedded credentials, as the README says).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from neuron_dra_cli import imagebuild
from neuron_dra_cli.stack.process import free_port

from tests.e2e.image.conftest import NAMESPACE, stop_stack_component
from tests.e2e.ultraserver.converged import wait_state, workload
from tests.fixtures.image import Container, podman, portable_kubeconfig
from tests.fixtures.stack import REPO, KubeStack

pytestmark = [pytest.mark.stack, pytest.mark.image, pytest.mark.timeout(900)]

SERVICES = ("slice-publisher", "topology-allocator", "ultraserver-operator")
ULTRASERVER_NODES = {f"us0-trn2u-48xl-{i}" for i in range(4)}


class _Reset(yaml.YAMLObject):
    """``!reset``: the compose merge tag that empties a key the base file sets."""

    yaml_tag = "!reset"

    @classmethod
    def to_yaml(cls, dumper: yaml.Dumper, data: object) -> yaml.Node:
        return dumper.represent_scalar(cls.yaml_tag, "")


def override(*, image: str, bus_env: dict[str, str], ports: dict[str, int]) -> str:
    services: dict[str, object] = {"nats": {"profiles": ["bundled-nats"]}}
    for name in SERVICES:
        services[name] = {
            "image": image,
            "network_mode": "host",
            "depends_on": _Reset(),
            "environment": {
                **bus_env,
                "NEURON_DRA_HTTP_HOST": "127.0.0.1",
                "NEURON_DRA_HTTP_PORT": str(ports[name]),
            },
        }
    return yaml.dump({"services": services}, sort_keys=False)


def containers_conf(path: Path) -> Path:
    """podman's settings for compose's containers: runc, cgroupfs, rlimits at the host's."""
    path.write_text(
        '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n'
        '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n'
    )
    return path


def test_compose_runs_the_cluster_services(
    image: str, image_stack: KubeStack, tmp_path: Path
) -> None:
    stack = image_stack
    project = f"neuron-dra-test-{uuid.uuid4().hex[:8]}"
    ports = {name: free_port() for name in SERVICES}
    extra = tmp_path / "compose.stack.yaml"
    extra.write_text(override(image=image, bus_env=stack.service_env(), ports=ports))
    env = {
        **imagebuild.tool_env(),
        "KUBECONFIG": str(portable_kubeconfig(stack.kubeconfig, tmp_path / "kubeconfig")),
        "CONTAINERS_CONF": str(containers_conf(tmp_path / "containers.conf")),
    }
    compose = [
        sys.executable, "-m", "podman_compose", "--project-name", project,
        "--file", str(REPO / "docker-compose.yml"), "--file", str(extra),
    ]  # fmt: skip

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*compose, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
        )

    for kind in SERVICES:
        stop_stack_component(stack, kind)
    stack.kubectl("delete", "resourceslices", "--all")
    up = run("up", "--detach")
    try:
        assert up.returncode == 0, f"{up.stdout}\n{up.stderr}"
        containers = {
            name: Container(name=f"{project}_{name}_1", http_port=port)
            for name, port in ports.items()
        }
        for c in containers.values():
            c.wait_http("/healthz")

        def pools() -> set[str]:
            return {
                s["spec"]["pool"]["name"]
                for s in stack.get_json("resourceslices")["items"]
                if s["spec"]["driver"] == "neuron.aws.com"
            }

        stack.wait_for(
            "the UltraServer nodes' ResourceSlices, written by compose's slice publisher",
            lambda: pools() >= ULTRASERVER_NODES,
            timeout=120,
        )
        stack.wait_for(
            "a NeuronUltraServer",
            lambda: stack.get_json("nus", "-n", NAMESPACE)["items"],
            timeout=120,
        )
        stack.kubectl("apply", "-f", "-", input=workload("compose-job", size=4))
        status = wait_state(stack, "compose-job", "Allocated", timeout=120)
        assert status["totalNodesAllocated"] == 4
        assert {n["nodeName"] for a in status["allocations"] for n in a["nodes"]} == (
            ULTRASERVER_NODES
        )

        stopped = run("stop")
        assert stopped.returncode == 0, f"{stopped.stdout}\n{stopped.stderr}"
        for c in containers.values():
            code = podman("inspect", "--format", "{{.State.ExitCode}}", c.name).stdout.strip()
            assert code == "0", f"{c.name} exited {code} on SIGTERM:\n{c.logs()[-4000:]}"
            assert "Traceback" not in c.logs()
    finally:
        run("down")
