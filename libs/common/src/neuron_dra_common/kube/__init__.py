"""The only module that talks to the Kubernetes API: client, informer, work queue, apply,
leader election."""

from neuron_dra_common.kube.apply import apply, apply_status
from neuron_dra_common.kube.client import (
    CONFIGMAPS,
    EVENTS,
    JSON,
    METADATA,
    NODES,
    PODS,
    PROTOBUF,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    UNANSWERED,
    ApiException,
    ConnectionLost,
    KubeClient,
    KubeConfig,
    PatchKind,
    Resource,
    close_open_clients,
    connect,
    object_key,
    retriable,
)
from neuron_dra_common.kube.config import ConfigError, load_in_cluster, load_kubeconfig
from neuron_dra_common.kube.informer import EventType, Informer, Transform
from neuron_dra_common.kube.leader import LEASES, Elector
from neuron_dra_common.kube.names import InvalidName
from neuron_dra_common.kube.workqueue import QueueShutDown, WorkQueue, run_workers

__all__ = [
    "CONFIGMAPS",
    "EVENTS",
    "JSON",
    "LEASES",
    "METADATA",
    "NODES",
    "PODS",
    "PROTOBUF",
    "RESOURCE_CLAIMS",
    "RESOURCE_SLICES",
    "UNANSWERED",
    "ApiException",
    "ConfigError",
    "ConnectionLost",
    "Elector",
    "EventType",
    "Informer",
    "InvalidName",
    "KubeClient",
    "KubeConfig",
    "PatchKind",
    "QueueShutDown",
    "Resource",
    "Transform",
    "WorkQueue",
    "apply",
    "apply_status",
    "close_open_clients",
    "connect",
    "load_in_cluster",
    "load_kubeconfig",
    "object_key",
    "retriable",
    "run_workers",
]
