"""The kube-scheduler extender v1 JSON shapes, and the parts of Pods and Nodes read from them.

The field names are Go's (``k8s.io/kube-scheduler/extender/v1``, ``types.go``): those types
carry no JSON tags, so the scheduler sends and expects ``Pod``, ``Nodes``, ``NodeNames``,
``FailedNodes``, ``FailedAndUnresolvableNodes``, ``Error``, ``PodName``, ``PodNamespace``,
``PodUID``, ``Node``, ``Host`` and ``Score``. ``Nodes`` is filled when the extender is
configured with ``nodeCacheCapable: false`` (AWS's chart), ``NodeNames`` when it is ``true``
(AWS's older policy files); the answer must use the same one.

Pure: decoding and encoding only.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "Container",
    "ExtenderArgs",
    "ExtenderBindingArgs",
    "ExtenderBindingResult",
    "ExtenderFilterResult",
    "HostPriority",
    "NodeList",
    "NodeView",
    "ObjectMeta",
    "PodView",
    "decode_args",
    "decode_binding",
    "decode_node",
    "encode",
]

#: Highest score a prioritize answer may give (``MaxExtenderPriority``).
MAX_PRIORITY = 10


class ObjectMeta(msgspec.Struct, frozen=True, kw_only=True):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}


class Resources(msgspec.Struct, frozen=True, kw_only=True):
    # Quantities arrive as strings ("9") or numbers; they are parsed where they are read.
    limits: dict[str, str | int | float] = {}
    requests: dict[str, str | int | float] = {}


class Container(msgspec.Struct, frozen=True, kw_only=True):
    name: str = ""
    resources: Resources = Resources()


class PodSpec(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    containers: list[Container] = []
    init_containers: list[Container] = []
    node_name: str = ""


class PodStatus(msgspec.Struct, frozen=True, kw_only=True):
    phase: str = ""


class PodView(msgspec.Struct, frozen=True, kw_only=True):
    """What the extender reads of a Pod."""

    metadata: ObjectMeta = ObjectMeta()
    spec: PodSpec = PodSpec()
    status: PodStatus = PodStatus()

    @property
    def key(self) -> str:
        return f"{self.metadata.namespace}/{self.metadata.name}"


class NodeStatus(msgspec.Struct, frozen=True, kw_only=True):
    capacity: dict[str, str | int | float] = {}
    allocatable: dict[str, str | int | float] = {}


class NodeView(msgspec.Struct, frozen=True, kw_only=True):
    """What the extender reads of a Node."""

    metadata: ObjectMeta = ObjectMeta()
    status: NodeStatus = NodeStatus()


class NodeList(msgspec.Struct, kw_only=True):
    # Kept raw: with nodeCacheCapable false the scheduler takes the Nodes it is given back
    # as the filtered list, so they are returned byte for byte.
    items: list[msgspec.Raw] = []


class ExtenderArgs(
    msgspec.Struct, kw_only=True, rename={"pod": "Pod", "nodes": "Nodes", "node_names": "NodeNames"}
):
    pod: PodView
    nodes: NodeList | None = None
    node_names: list[str] | None = None


class ExtenderFilterResult(
    msgspec.Struct,
    kw_only=True,
    rename={
        "nodes": "Nodes",
        "node_names": "NodeNames",
        "failed_nodes": "FailedNodes",
        "failed_and_unresolvable_nodes": "FailedAndUnresolvableNodes",
        "error": "Error",
    },
):
    nodes: NodeList | None = None
    node_names: list[str] | None = None
    failed_nodes: dict[str, str] = {}
    failed_and_unresolvable_nodes: dict[str, str] = {}
    error: str = ""


class HostPriority(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    gc=False,
    rename={"host": "Host", "score": "Score"},
):
    # gc=False: a name and a number can hold no cycle, and the extender keeps one per node
    # and kind of request: the garbage collector's full passes need not walk them.

    host: str
    score: int


class ExtenderBindingArgs(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    rename={
        "pod_name": "PodName",
        "pod_namespace": "PodNamespace",
        "pod_uid": "PodUID",
        "node": "Node",
    },
):
    pod_name: str
    pod_namespace: str
    pod_uid: str = ""
    node: str


class ExtenderBindingResult(msgspec.Struct, frozen=True, kw_only=True, rename={"error": "Error"}):
    error: str = ""


_args = msgspec.json.Decoder(ExtenderArgs)
_binding = msgspec.json.Decoder(ExtenderBindingArgs)
_node = msgspec.json.Decoder(NodeView)
_encoder = msgspec.json.Encoder()


def decode_args(body: bytes | bytearray) -> ExtenderArgs:
    """The body of a filter or prioritize call; raises ``msgspec.DecodeError`` (or
    ``ValidationError``) naming the bad field."""
    return _args.decode(body)


def decode_binding(body: bytes | bytearray) -> ExtenderBindingArgs:
    return _binding.decode(body)


def decode_node(raw: msgspec.Raw | bytes) -> NodeView:
    return _node.decode(raw)


def encode(value: object) -> bytes:
    return _encoder.encode(value)
