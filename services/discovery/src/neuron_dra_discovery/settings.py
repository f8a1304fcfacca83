"""Discovery's settings; every field also reads ``NEURON_DRA_<FIELD>`` (e.g. ``NEURON_DRA_NODE_NAME``)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

import msgspec
from neuron_dra_common.settings import ServiceSettings

__all__ = ["DiscoverySettings", "package_version"]


def package_version() -> str:
    """This driver's version, published as ``draDriverVersion``."""
    try:
        return version("neuron-dra-discovery")
    except PackageNotFoundError:  # running from a source tree without metadata
        return "0.0.0"


class DiscoverySettings(ServiceSettings, frozen=True, kw_only=True):
    """Reads this node's Neuron hardware and publishes its NodeInventory."""

    node_name: Annotated[
        str, msgspec.Meta(min_length=1, description="This node's Kubernetes name (downward API)")
    ]
    hardware_root: Annotated[
        str, msgspec.Meta(description="Root under which /sys, /dev and /opt are read")
    ] = "/"
    neuron_ls_command: Annotated[
        tuple[str, ...],
        msgspec.Meta(description="neuron-ls command line, comma-separated (default neuron-ls -j)"),
    ] = ()
    neuron_ls_path: Annotated[
        str, msgspec.Meta(description="Read neuron-ls -j output from this file instead")
    ] = ""
    instance_type: Annotated[
        str, msgspec.Meta(description="Instance type override (default: the DMI product name)")
    ] = ""
    boot_id_path: Annotated[str, msgspec.Meta(description="File holding the node's boot id")] = (
        "/proc/sys/kernel/random/boot_id"
    )
    poll_seconds: Annotated[
        float, msgspec.Meta(gt=0, description="Seconds between hardware reads")
    ] = 10.0
    heartbeat_seconds: Annotated[
        float, msgspec.Meta(gt=0, description="Seconds between heartbeats (full inventory)")
    ] = 60.0
    dra_driver_version: Annotated[
        str, msgspec.Meta(description="draDriverVersion to publish (default: this package's)")
    ] = ""
