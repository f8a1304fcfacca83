"""Discovery's settings; every field also reads ``NEURON_DRA_<FIELD>`` (e.g. ``NEURON_DRA_NODE_NAME``)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from neuron_dra_common.settings import NodeLivenessSettings

__all__ = ["DiscoverySettings"]


class DiscoverySettings(NodeLivenessSettings, frozen=True, kw_only=True):
    """Reads this node's Neuron hardware and publishes its NodeInventory."""

    poll_seconds: Annotated[
        float, msgspec.Meta(gt=0, description="Seconds between hardware reads")
    ] = 10.0
    heartbeat_seconds: Annotated[
        float, msgspec.Meta(gt=0, description="Seconds between heartbeats (full inventory)")
    ] = 60.0
    dra_driver_version: Annotated[
        str,
        msgspec.Meta(description="draDriverVersion to publish; empty: the installed driver's"),
    ] = ""
