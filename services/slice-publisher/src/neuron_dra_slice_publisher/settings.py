"""The slice publisher's settings; every field also reads ``NEURON_DRA_<FIELD>``."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from neuron_dra_common.bus.declarations import PUBLISHER_SHARES
from neuron_dra_common.settings import LeaderElectedSettings

__all__ = ["SlicePublisherSettings"]


class SlicePublisherSettings(LeaderElectedSettings, frozen=True, kw_only=True):
    """Writes each node's pool of ResourceSlices from the NodeInventory events."""

    lease_name: Annotated[str, msgspec.Meta(min_length=1, description="Lease name")] = (
        "neuron-dra-slice-publisher"
    )
    node_device: Annotated[
        Literal["auto", "counters", "node-only", "chips-only"],
        msgspec.Meta(
            description="How node and chip devices stay exclusive (auto: counters where the "
            "cluster keeps shared counters, else node-only)"
        ),
    ] = "auto"
    slice_encoding: Annotated[
        Literal["protobuf", "json"],
        msgspec.Meta(
            description="Request body encoding of slice writes (protobuf costs the apiserver "
            "less to decode)"
        ),
    ] = "protobuf"
    device_taints: Annotated[
        Literal["auto", "on", "off"],
        msgspec.Meta(
            description="Unhealthy devices as DRA device taints (on), or left out of the pool "
            "(off, for clusters without DRADeviceTaints); auto: taints where the cluster keeps "
            "them"
        ),
    ] = "auto"
    probe_timeout: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="Seconds to keep asking the apiserver which features it keeps (shared "
            "counters, device taints) before refusing to start; an error is never taken for "
            "an answer",
        ),
    ] = 120.0
    workers: Annotated[int, msgspec.Meta(ge=1, le=256, description="Concurrent pool writes")] = 16
    partitions: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            le=PUBLISHER_SHARES,
            description="Shares of the nodes, each written by whichever replica holds its "
            "Lease (<lease_name>-<share>); 1: one Lease, one writer for all nodes",
        ),
    ] = 1
