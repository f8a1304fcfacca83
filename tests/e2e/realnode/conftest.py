"""Local stacks with one real node (the real kubelet with containerd and runc) beside
simulated nodes, for the real-node tests of this package:

- ``real_stack``: the driver's own DaemonSets on the real node (``--real-node-driver``);
- ``device_plugin_stack``: a mixed cluster, the device plugin's DaemonSet on the real node
  and the scheduler extender in kube-scheduler (``--real-node-device-plugin``), DRA agents
  on the simulated node.

The kubelet's device manager socket is one per host (``/var/lib/kubelet/device-plugins``),
so the two must not run at once: ``device_plugin_stack`` lives for one module, and its
module sorts before the ones using ``real_stack`` (which lives until the package ends).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from neuron_dra_cli import imagebuild
from neuron_dra_cli.stack import realnodes

from tests.fixtures.image import skip_unless_required
from tests.fixtures.stack import REPO, KubeStack, neuron_dra, start_stack, stop_stack

FLEET = REPO / "tests" / "fleets" / "bare.yaml"
MIXED_FLEET = REPO / "tests" / "fleets" / "mixed.yaml"
REAL_NODE = "real-node-0"


def _require_real_node() -> None:
    """Skip, with what is missing, where a real node cannot run (not root, no runc or CNI
    plugins); with ``NEURON_DRA_REQUIRE_IMAGE_TESTS=1`` (CI) fail instead."""
    missing = realnodes.missing_requirements()
    if missing:
        skip_unless_required(f"a real node needs {'; '.join(missing)}")


def _stack(state_dir: Path, *, fleet: Path, extra: list[str]) -> Iterator[KubeStack]:
    _require_real_node()
    stack = start_stack(state_dir, fleet=fleet, extra=extra)
    try:
        yield stack
    finally:
        stop_stack(state_dir)


def real_node_stack(
    tmp_path_factory: pytest.TempPathFactory, *, name: str, extra: tuple[str, ...] = ()
) -> Iterator[KubeStack]:
    """The stack of a package-scoped fixture: one real node with the driver's DaemonSets
    beside one simulated node the driver leaves alone, and ``extra`` flags of ``dev up``."""
    yield from _stack(
        tmp_path_factory.mktemp(name),
        fleet=FLEET,
        extra=["--real-nodes", "1", "--real-node-driver", *extra],
    )


@pytest.fixture(scope="package")
def real_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    """The real node beside one simulated node the driver leaves alone, the driver's
    DaemonSets on the real node, and NATS the base's StatefulSet there: on the open bus
    (``--insecure-bus``, said by every service), the one mode where the stack does not keep
    its own server. tests/e2e/realnode/busauth runs the default, authenticated bus."""
    yield from real_node_stack(tmp_path_factory, name="real-stack", extra=("--insecure-bus",))


@pytest.fixture(scope="module")
def device_plugin_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    """The real node served by the device plugin beside one simulated DRA node, on the
    authenticated bus (as production runs): the plugin reads its health events with its own
    projected bus token."""
    yield from _stack(
        tmp_path_factory.mktemp("device-plugin-stack"),
        fleet=MIXED_FLEET,
        extra=["--real-nodes", "1", "--real-node-device-plugin", "--bus-auth"],
    )


def import_image(stack: KubeStack, ref: str) -> None:
    """``neuron-dra dev import-image REF``, as a user runs it."""
    proc = neuron_dra("dev", "import-image", ref, "--state-dir", str(stack.state_dir))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"imported {ref} into {REAL_NODE}\n"


def import_base(stack: KubeStack, *, namespace: str) -> str:
    """The local Debian base, imported into the real node's containerd, and ``namespace``
    created for the pods that run it."""
    ref = imagebuild.ensure_base(progress=lambda _m: None)
    import_image(stack, ref)
    stack.create_namespace(namespace)
    return ref
