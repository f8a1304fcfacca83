"""What the commands print: versions, service help without Python reprs, JSON on request."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from neuron_dra_cli.env_cmd import ContainerView, as_json
from neuron_dra_cli.main import main
from neuron_dra_common.driver import package_version

BIN = Path(sys.executable).parent
SERVICES = [
    "neuron-dra-discovery",
    "neuron-dra-kubelet-plugin",
    "neuron-dra-slice-publisher",
    "neuron-dra-topology-allocator",
    "neuron-dra-ultraserver-operator",
]
# What a Python repr looks like in help text: quotes, tuples, enum members, paths.
REPR = re.compile(r"\(default: ['\"(<]|PosixPath|<\w+\.\w+:")


def test_version_is_the_installed_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"neuron-dra {package_version('neuron-dra-cli')}"
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", package_version("neuron-dra-cli"))


@pytest.mark.parametrize("command", SERVICES)
def test_service_help_prints_defaults_as_a_user_writes_them(command: str) -> None:
    out = subprocess.run([str(BIN / command), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "(default: " in text
    assert not REPR.search(text), REPR.search(text)
    assert "NEURON_DRA_NATS_SERVERS (default: nats://127.0.0.1:4222)" in text
    assert "NEURON_DRA_LOG_LEVEL (default: info)" in text
    # One default per option, in one spelling: "(default" only as the help's own suffix.
    options = re.split(r" --[a-z-]+ NEURON_DRA_", text)[1:]
    assert all(o.count("(default") <= 1 for o in options), [
        o for o in options if o.count("(default") > 1
    ]


def test_allocator_help_shows_the_strategy_by_its_name() -> None:
    out = subprocess.run(
        [str(BIN / "neuron-dra-topology-allocator"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "NEURON_DRA_STRATEGY (default: best-fit)" in " ".join(out.stdout.split())


def test_status_without_a_stack_is_json_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["dev", "status", "--state-dir", str(tmp_path), "-o", "json"])
    assert code == 3
    assert json.loads(capsys.readouterr().out) == {"stateDir": str(tmp_path), "running": False}


def test_env_json_lists_each_container_with_its_devices_and_variables() -> None:
    view = ContainerView(
        name="main",
        claims=["neurons"],
        cdi_ids=["neuron.aws.com/neuron=u1-neurondevice0"],
        device_nodes=[("/dev/neuron0", "/sim/dev/neuron0")],
        env=["NEURON_RT_VISIBLE_CORES=0-3", "NEURON_LOGICAL_NC_CONFIG=2"],
    )
    pod = {"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}
    doc = json.loads(json.dumps(as_json("default", pod, [view])))
    assert doc == {
        "pod": "default/p",
        "node": "n1",
        "phase": "Running",
        "containers": [
            {
                "name": "main",
                "claims": ["neurons"],
                "cdiDevices": ["neuron.aws.com/neuron=u1-neurondevice0"],
                "deviceNodes": [{"path": "/dev/neuron0", "hostPath": "/sim/dev/neuron0"}],
                "env": {"NEURON_RT_VISIBLE_CORES": "0-3", "NEURON_LOGICAL_NC_CONFIG": "2"},
                "problems": [],
            }
        ],
    }
