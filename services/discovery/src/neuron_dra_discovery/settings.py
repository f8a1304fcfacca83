"""Discovery's settings; every field also reads ``NEURON_DRA_<FIELD>`` (e.g. ``NEURON_DRA_NODE_NAME``)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from neuron_dra_common.settings import NodeHardwareSettings

__all__ = ["DiscoverySettings"]


class DiscoverySettings(NodeHardwareSettings, frozen=True, kw_only=True):
    """Reads this node's Neuron hardware and publishes its NodeInventory."""

    poll_seconds: Annotated[
        float, msgspec.Meta(gt=0, description="Seconds between hardware reads")
    ] = 10.0
    heartbeat_seconds: Annotated[
        float, msgspec.Meta(gt=0, description="Seconds between heartbeats (full inventory)")
    ] = 60.0
    liveness_seconds: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            le=60,
            description="Seconds between NodeHeartbeat messages, the cluster failure detector's "
            "sign that the node is alive (it declares a node lost after a few missed)",
        ),
    ] = 1.0
    kubelet_healthz_url: Annotated[
        str,
        msgspec.Meta(
            description="The node's kubelet health endpoint (the kubelet's default is "
            "http://127.0.0.1:10248/healthz); when set, heartbeats stop while it does not "
            "answer ok, so a node whose kubelet died is declared lost; empty: not checked"
        ),
    ] = ""
    dra_driver_version: Annotated[
        str,
        msgspec.Meta(description="draDriverVersion to publish; empty: the installed driver's"),
    ] = ""
