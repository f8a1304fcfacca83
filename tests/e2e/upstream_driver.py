"""The upstream DRA test driver (built at the same pin as the control plane) as a kubelet
plugin on one simulated node, and a claim's whole life through it: the kubelet prepares the
claim, runs the pod, and unprepares the claim when the pod is deleted."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from neuron_dra_cli import kubebuild
from neuron_dra_cli.stack.layout import Layout

from tests.fixtures.stack import KubeStack

DRIVER = "test-driver.cdi.k8s.io"
NODE = "inf2-48xl-0"


class UpstreamTestDriver:
    def __init__(self, stack: KubeStack, node: str, workdir: Path) -> None:
        self.stack = stack
        self.node = node
        self.root = Layout(stack.state_dir).kubelet_root(node)
        self.cdi = workdir / "cdi"
        self.log = workdir / "test-driver.log"
        # As on a real node, the plugin's socket directory exists before it starts (a
        # hostPath mount there); the driver creates only its parent.
        (self.root / "plugins" / DRIVER).mkdir(parents=True, exist_ok=True)
        bins = kubebuild.ensure_binaries(stack.k8s_version, progress=lambda _m: None)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    str(bins.dra_test_driver),
                    f"--kubeconfig={stack.kubeconfig}",
                    f"--drivername={DRIVER}",
                    "kubelet-plugin",
                    f"--node-name={node}",
                    f"--datadir={self.root / 'plugins'}",
                    f"--plugin-registration-path={self.root / 'plugins_registry'}",
                    f"--cdi-dir={self.cdi}",
                    "--num-devices=2",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run_claim_lifecycle(stack: KubeStack, workdir: Path) -> None:
    driver = UpstreamTestDriver(stack, NODE, workdir)
    try:
        stack.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "DeviceClass",
                    "metadata": {"name": DRIVER},
                    "spec": {
                        "selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]
                    },
                }
            ),
        )
        # The plugin publishes its devices once the kubelet has registered it.
        stack.wait_for(
            f"{DRIVER} to publish a ResourceSlice for {NODE}",
            lambda: [
                s
                for s in stack.get_json("resourceslices")["items"]
                if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == NODE
            ],
            timeout=60,
        )
        manifest = {
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaimTemplate",
                    "metadata": {"name": "one-test-device", "namespace": "default"},
                    "spec": {
                        "spec": {
                            "devices": {
                                "requests": [
                                    {"name": "dev", "exactly": {"deviceClassName": DRIVER}}
                                ]
                            }
                        }
                    },
                },
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "uses-test-device", "namespace": "default"},
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": NODE},
                        "containers": [
                            {
                                "name": "c",
                                "image": "busybox",
                                "resources": {"claims": [{"name": "dev"}]},
                            }
                        ],
                        "resourceClaims": [
                            {"name": "dev", "resourceClaimTemplateName": "one-test-device"}
                        ],
                    },
                },
            ],
        }
        stack.kubectl("apply", "-f", "-", input=json.dumps(manifest))
        stack.wait_for(
            "the pod to be Running",
            lambda: (
                stack.get_json("pod", "uses-test-device", "-n", "default")["status"].get("phase")
                == "Running"
            ),
            timeout=90,
        )
        claims = [
            c
            for c in stack.get_json("resourceclaims", "-n", "default")["items"]
            if any(
                o.get("name") == "uses-test-device"
                for o in c["metadata"].get("ownerReferences", [])
            )
        ]
        assert len(claims) == 1
        claim = claims[0]
        uid = claim["metadata"]["uid"]
        assert claim["status"]["allocation"]["devices"]["results"][0]["driver"] == DRIVER
        assert [r["name"] for r in claim["status"]["reservedFor"]] == ["uses-test-device"]
        # The driver wrote a CDI spec for the claim: proof that the kubelet called Prepare.
        assert any(uid in p.name for p in driver.cdi.glob("*")), list(driver.cdi.glob("*"))

        stack.kubectl("delete", "pod", "uses-test-device", "-n", "default", "--wait=false")
        stack.wait_for(
            "the pod to be gone",
            lambda: (
                stack.kubectl(
                    "get", "pod", "uses-test-device", "-n", "default", check=False
                ).returncode
                != 0
            ),
            timeout=90,
        )
        # Unprepare removed the CDI spec, and the claim made from the template is freed.
        assert not any(uid in p.name for p in driver.cdi.glob("*"))
        stack.wait_for(
            "the claim to be deleted",
            lambda: (
                stack.kubectl(
                    "get", "resourceclaim", claim["metadata"]["name"], "-n", "default", check=False
                ).returncode
                != 0
            ),
            timeout=60,
        )
    finally:
        driver.stop()
        stack.kubectl(
            "delete",
            "resourceclaimtemplate",
            "one-test-device",
            "-n",
            "default",
            "--ignore-not-found",
        )
