"""The chaos check of every node's files: the kubelet plugin's checkpoint and CDI specs, as the
plugin writes them, hold each device at most once."""

from __future__ import annotations

from pathlib import Path

from neuron_dra_cli.stack.state import ComponentState
from neuron_dra_common import cdi
from neuron_dra_kubelet_plugin.checkpoint import (
    Checkpoint,
    CheckpointStore,
    ClaimEntry,
    ClaimState,
    PreparedDevice,
)

from chaos.observe import checkpoint_path, node_files_problems


def plugin(tmp_path: Path, node: str) -> ComponentState:
    return ComponentState(
        name=f"kubelet-plugin-{node}",
        kind="kubelet-plugin",
        pid=1,
        start_ticks=1,
        log="",
        env={
            "NEURON_DRA_NODE_NAME": node,
            "NEURON_DRA_KUBELET_ROOT": str(tmp_path / node / "kubelet"),
            "NEURON_DRA_CDI_ROOT": str(tmp_path / node / "cdi"),
        },
    )


def entry(uid: str, *devices: str) -> ClaimEntry:
    return ClaimEntry(
        uid=uid,
        namespace="chaos",
        name=uid,
        state=ClaimState.PREPARE_COMPLETED,
        boot_id="b",
        devices=tuple(PreparedDevice(request_names=("r",), pool="n", device=d) for d in devices),
    )


def spec(uid: str, *indexes: int) -> cdi.Spec:
    return cdi.Spec(
        cdi_version=cdi.CDI_VERSION,
        kind=cdi.NEURON_CDI_KIND,
        devices=tuple(
            cdi.Device(
                name=cdi.claim_device_name(uid, f"neurondevice{i}"),
                container_edits=cdi.ContainerEdits(
                    device_nodes=(cdi.DeviceNode(path=f"/dev/neuron{i}"),)
                ),
            )
            for i in indexes
        ),
    )


def write(component: ComponentState, checkpoint: Checkpoint, specs: dict[str, cdi.Spec]) -> None:
    path = checkpoint_path(component)
    path.parent.mkdir(parents=True, exist_ok=True)
    store = CheckpointStore(path)
    store.save(checkpoint)
    store.close()
    root = Path(component.env["NEURON_DRA_CDI_ROOT"])
    root.mkdir(parents=True, exist_ok=True)
    for uid, s in specs.items():
        cdi.write_claim_spec(root, uid, s)


def test_distinct_devices_on_every_node_and_a_node_without_files_are_fine(tmp_path: Path) -> None:
    a, b = plugin(tmp_path, "a"), plugin(tmp_path, "b")
    write(
        a,
        Checkpoint()
        .with_entry(entry("u1", "neurondevice0"))
        .with_entry(entry("u2", "neurondevice1")),
        {"u1": spec("u1", 0), "u2": spec("u2", 1)},
    )
    assert node_files_problems([a, b]) == []


def test_a_device_twice_in_one_nodes_files_is_named_with_the_node(tmp_path: Path) -> None:
    a, b = plugin(tmp_path, "a"), plugin(tmp_path, "b")
    write(a, Checkpoint().with_entry(entry("u1", "neurondevice0")), {"u1": spec("u1", 0)})
    doubled = Checkpoint().with_entry(entry("u1", "neurondevice3"))
    write(
        b,
        doubled.with_entry(entry("u2", "neurondevice3")),
        {"u1": spec("u1", 3), "u2": spec("u2", 3)},
    )
    assert node_files_problems([a, b]) == [
        "node b: checkpoint holds neurondevice3 in 2 claims (u1, u2)",
        "node b: CDI specs hold /dev/neuron3 in 2 claims (u1, u2)",
    ]


def test_a_monitors_admin_access_claim_is_not_a_second_holder(tmp_path: Path) -> None:
    a = plugin(tmp_path, "a")
    monitor = ClaimEntry(
        uid="m1",
        namespace="monitoring",
        name="m1",
        state=ClaimState.PREPARE_COMPLETED,
        boot_id="b",
        devices=(
            PreparedDevice(
                request_names=("r",), pool="a", device="neurondevice3", admin_access=True
            ),
        ),
    )
    write(
        a,
        Checkpoint().with_entry(entry("u1", "neurondevice3")).with_entry(monitor),
        {"u1": spec("u1", 3), "m1": spec("m1", 3)},
    )
    assert node_files_problems([a]) == []
