"""The fleet file: which simulated nodes the local stack runs.

Example (``deploy/fleets/default.yaml``)::

    region: us-west-2
    nodes:
      - instanceType: trn2.48xlarge
        count: 4
    ultraServers:
      - instanceType: trn2u.48xlarge
        count: 1

Every mistake is reported with the file, the line and the field, for example
``fleet.yaml:5: nodes[0].count: expected a whole number from 1 to 1000, got 'four'``.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from neuron_dra_cli import kubebuild
from neuron_dra_cli.stack.instances import SHAPES, ULTRASERVER_TYPES

DEFAULT_DRIVER_VERSION = "2.24.7.0"
UNMANAGED_LABEL = "neuron.aws.com/driver"
#: ``device-plugin`` on a node: its devices are served by the device plugin, not DRA.
DEVICE_MANAGEMENT_LABEL = "neuron.aws.com/device-management"
ULTRASERVER_NODES = 4
_GROUP_FIELDS = {
    "instanceType", "count", "namePrefix", "driverVersion", "lnc", "labels", "kubeletVersion"
}  # fmt: skip
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$")
_LABEL_KEY_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


class FleetError(ValueError):
    """A fleet file that cannot be used; the message names the line and the field."""


@dataclass(frozen=True)
class UltraServerMember:
    """Where a node sits in its UltraServer."""

    index: int  # which UltraServer of the fleet
    server_id_4: str
    server_id_2: str
    node_id_4: int
    node_id_2: int
    capacity_block_id: str


@dataclass(frozen=True)
class NodeSpec:
    """One simulated node."""

    name: str
    instance_type: str
    driver_version: str
    lnc: int | None = None
    ultraserver: UltraServerMember | None = None
    labels: dict[str, str] = field(default_factory=dict)
    #: The node's own kubelet release (``kubeletVersion``), when it differs from the stack's.
    kubelet_version: str = ""

    @property
    def managed(self) -> bool:
        """False for a node labelled ``neuron.aws.com/driver: "false"`` in the fleet file:
        it gets no simulated hardware, no discovery and no kubelet plugin, so its pool is
        left to whoever writes it (tests that hand-write ResourceSlices use such nodes)."""
        return self.labels.get(UNMANAGED_LABEL) != "false"

    @property
    def device_plugin(self) -> bool:
        """True for a managed node labelled ``neuron.aws.com/device-management:
        device-plugin`` in the fleet file: as on a cluster, the device plugin serves its
        devices (``aws.amazon.com/neuron`` and friends, placed by the scheduler extender)
        and the DRA agents (discovery, kubelet plugin) stay off it."""
        return self.managed and self.labels.get(DEVICE_MANAGEMENT_LABEL) == "device-plugin"

    @property
    def dra(self) -> bool:
        """True for a node whose devices the DRA agents serve (managed, not the plugin's)."""
        return self.managed and not self.device_plugin


@dataclass(frozen=True)
class Fleet:
    region: str
    zone: str
    nodes: tuple[NodeSpec, ...]


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, node: Node, path: str, message: str) -> FleetError:
        return FleetError(f"{self.source}:{node.start_mark.line + 1}: {path}: {message}")

    def mapping(self, node: Node, path: str, allowed: set[str]) -> dict[str, Node]:
        if not isinstance(node, MappingNode):
            raise self.fail(node, path, "expected a mapping of fields")
        out: dict[str, Node] = {}
        for key_node, value in node.value:
            key = key_node.value if isinstance(key_node, ScalarNode) else None
            if key not in allowed:
                known = ", ".join(sorted(allowed))
                raise self.fail(key_node, path, f"unknown field {key!r} (known: {known})")
            if key in out:
                raise self.fail(key_node, f"{path}.{key}", "given twice")
            out[key] = value
        return out

    def string(self, node: Node, path: str) -> str:
        if not isinstance(node, ScalarNode) or node.tag != "tag:yaml.org,2002:str":
            raise self.fail(node, path, "expected a string")
        return str(node.value)

    def integer(self, node: Node, path: str, *, low: int, high: int) -> int:
        raw = str(node.value) if isinstance(node, ScalarNode) else None
        value = None
        if raw is not None and node.tag == "tag:yaml.org,2002:int":
            with contextlib.suppress(ValueError):
                value = int(raw)
        if value is None or not low <= value <= high:
            raise self.fail(
                node, path, f"expected a whole number from {low} to {high}, got {raw!r}"
            )
        return value

    def sequence(self, node: Node, path: str) -> list[Node]:
        if not isinstance(node, SequenceNode):
            raise self.fail(node, path, "expected a list")
        return list(node.value)


def _short(instance_type: str) -> str:
    family, _, size = instance_type.partition(".")
    return f"{family}-{size.replace('xlarge', 'xl')}"


def _kubelet_version(r: _Reader, item: Node, path: str) -> str:
    """A node group's ``kubeletVersion``: a release ``kubebuild`` builds a simulated node of
    (a supported one, or one of ``NODE_RELEASES``, kubelets the product warns about)."""
    g = r.mapping(item, path, _GROUP_FIELDS)
    if "kubeletVersion" not in g:
        return ""
    version = r.string(g["kubeletVersion"], f"{path}.kubeletVersion").removeprefix("v")
    known = {*kubebuild.SUPPORTED, *kubebuild.NODE_RELEASES}
    if version not in known:
        raise r.fail(
            g["kubeletVersion"],
            f"{path}.kubeletVersion",
            f"no simulated node of kubelet {version!r} (known: {', '.join(sorted(known))})",
        )
    return version


def parse_fleet(text: str, *, source: str = "fleet") -> Fleet:
    """Parse and expand a fleet file; raise :class:`FleetError` naming line and field."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise FleetError(f"{source}{line}: not valid YAML: {exc}") from None
    if root is None:
        raise FleetError(f"{source}: empty fleet file: list at least one node under 'nodes'")
    r = _Reader(source)
    top = r.mapping(root, "fleet", {"region", "zone", "nodes", "ultraServers"})
    region = r.string(top["region"], "region") if "region" in top else "us-west-2"
    zone = r.string(top["zone"], "zone") if "zone" in top else f"{region}a"
    nodes: list[NodeSpec] = []
    seen: dict[str, str] = {}
    group_fields = _GROUP_FIELDS

    def group(
        item: Node, path: str, *, ultra: bool
    ) -> tuple[str, int, str, str, int | None, dict[str, str]]:
        g = r.mapping(item, path, group_fields)
        if "instanceType" not in g:
            raise r.fail(item, path, "missing field 'instanceType'")
        itype = r.string(g["instanceType"], f"{path}.instanceType")
        if itype not in SHAPES:
            raise r.fail(
                g["instanceType"],
                f"{path}.instanceType",
                f"unknown instance type {itype!r} (known: {', '.join(SHAPES)})",
            )
        if ultra and itype not in ULTRASERVER_TYPES:
            raise r.fail(
                g["instanceType"],
                f"{path}.instanceType",
                f"{itype} does not come as an UltraServer (use one of: "
                f"{', '.join(sorted(ULTRASERVER_TYPES))}, or list it under 'nodes')",
            )
        if not ultra and itype in ULTRASERVER_TYPES:
            raise r.fail(
                g["instanceType"],
                f"{path}.instanceType",
                f"{itype} nodes come in UltraServers: list them under 'ultraServers'",
            )
        count = r.integer(g["count"], f"{path}.count", low=1, high=1000) if "count" in g else 1
        prefix = r.string(g["namePrefix"], f"{path}.namePrefix") if "namePrefix" in g else ""
        if prefix and not _NAME_RE.match(prefix.rstrip("-") or "x"):
            raise r.fail(
                g["namePrefix"], f"{path}.namePrefix", "lower-case letters, digits and '-' only"
            )
        driver = (
            r.string(g["driverVersion"], f"{path}.driverVersion")
            if "driverVersion" in g
            else DEFAULT_DRIVER_VERSION
        )
        if not re.fullmatch(r"\d+\.\d+\.\d+(\.\d+)?", driver):
            raise r.fail(
                g["driverVersion"],
                f"{path}.driverVersion",
                f"expected a version like 2.24.7.0, got {driver!r}",
            )
        lnc = None
        if "lnc" in g:
            lnc = r.integer(g["lnc"], f"{path}.lnc", low=1, high=2)
        labels: dict[str, str] = {}
        if "labels" in g:
            lab = g["labels"]
            if not isinstance(lab, MappingNode):
                raise r.fail(lab, f"{path}.labels", "expected a mapping of label: value")
            for k, v in lab.value:
                key = r.string(k, f"{path}.labels")
                if not _LABEL_KEY_RE.match(key):
                    raise r.fail(k, f"{path}.labels.{key}", "not a valid label key")
                labels[key] = r.string(v, f"{path}.labels.{key}")
        return itype, count, prefix, driver, lnc, labels

    def add(spec: NodeSpec, item: Node, path: str) -> None:
        if spec.name in seen:
            raise r.fail(item, path, f"node name {spec.name!r} is also made by {seen[spec.name]}")
        seen[spec.name] = path
        nodes.append(spec)

    for i, item in enumerate(r.sequence(top["nodes"], "nodes") if "nodes" in top else []):
        path = f"nodes[{i}]"
        itype, count, prefix, driver, lnc, labels = group(item, path, ultra=False)
        base = prefix or f"{_short(itype)}-"
        kubelet = _kubelet_version(r, item, path)
        for n in range(count):
            spec = NodeSpec(f"{base}{n}", itype, driver, lnc, None, labels, kubelet)
            add(spec, item, path)

    us_index = 0
    for i, item in enumerate(
        r.sequence(top["ultraServers"], "ultraServers") if "ultraServers" in top else []
    ):
        path = f"ultraServers[{i}]"
        itype, count, prefix, driver, lnc, labels = group(item, path, ultra=True)
        for _ in range(count):
            server_id_4 = f"{hash_name(f'ultraserver-{us_index}', 4):016x}"
            block = f"cr-{us_index:017x}"
            for node_id in range(ULTRASERVER_NODES):
                # Vertical pairs are {0,1} and {2,3}; the 2-node server id names the pair.
                pair = node_id // 2
                member = UltraServerMember(
                    index=us_index,
                    server_id_4=server_id_4,
                    server_id_2=f"{hash_name(f'ultraserver-{us_index}-{pair}', 2):016x}",
                    node_id_4=node_id,
                    node_id_2=node_id % 2,
                    capacity_block_id=block,
                )
                base = prefix or f"us{us_index}-{_short(itype)}-"
                add(NodeSpec(f"{base}{node_id}", itype, driver, lnc, member, labels), item, path)
            us_index += 1

    if not nodes:
        raise FleetError(
            f"{source}: the fleet has no nodes: add an entry under 'nodes' or 'ultraServers'"
        )
    return Fleet(region=region, zone=zone, nodes=tuple(nodes))


def load_fleet(path: Path) -> Fleet:
    """Read and parse a fleet file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise FleetError(f"{path}: cannot read the fleet file: {exc.strerror}") from None
    return parse_fleet(text, source=str(path))


def node_labels(fleet: Fleet, node: NodeSpec) -> dict[str, str]:
    """The labels an EKS node of this type carries (plus the fleet's own)."""
    labels = {
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": node.instance_type,
        "topology.kubernetes.io/region": fleet.region,
        "topology.kubernetes.io/zone": fleet.zone,
        "eks.amazonaws.com/nodegroup": _short(node.instance_type),
        "eks.amazonaws.com/capacityType": "ON_DEMAND",
        "topology.k8s.aws/network-node-layer-1": "nn-" + f"{hash_name(fleet.region, 1):017x}",
        "topology.k8s.aws/network-node-layer-2": "nn-" + f"{hash_name(node.instance_type, 2):017x}",
        "topology.k8s.aws/network-node-layer-3": "nn-" + f"{hash_name(node.name, 3):017x}",
    }
    us = node.ultraserver
    if us is not None:
        labels.update(
            {
                "eks.amazonaws.com/capacityType": "CAPACITY_BLOCK",
                "topology.k8s.aws/capacity-block-id": us.capacity_block_id,
                "neuron.amazonaws.com/ultraserver-mode": "1_2_4",
                "neuron.amazonaws.com/ultraserver-server-id-4": us.server_id_4,
                "neuron.amazonaws.com/ultraserver-server-id-2": us.server_id_2,
                "neuron.amazonaws.com/ultraserver-node-id-4": str(us.node_id_4),
                "neuron.amazonaws.com/ultraserver-node-id-2": str(us.node_id_2),
                # One UltraServer shares its last network layer.
                "topology.k8s.aws/network-node-layer-3": "nn-"
                + f"{hash_name(us.server_id_4, 3):017x}",
            }
        )
    labels.update(node.labels)
    return labels


def hash_name(name: str, salt: int) -> int:
    """A stable small number from a name (Python's hash() is salted per process)."""
    import hashlib

    return int.from_bytes(hashlib.sha256(f"{salt}:{name}".encode()).digest()[:8], "big") >> 4
