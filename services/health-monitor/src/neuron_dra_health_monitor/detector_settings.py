"""The failure detector's settings; every field also reads ``NEURON_DRA_<FIELD>``."""

from __future__ import annotations

from typing import Annotated

import msgspec
from neuron_dra_common.settings import LeaderElectedSettings

__all__ = ["DetectorSettings"]


class DetectorSettings(LeaderElectedSettings, frozen=True, kw_only=True):
    """Declares Neuron nodes lost and recovered from their heartbeats."""

    lease_name: Annotated[str, msgspec.Meta(min_length=1, description="Lease name")] = (
        "neuron-dra-failure-detector"
    )
    kubernetes: Annotated[
        bool,
        msgspec.Meta(
            description="Use the Kubernetes API: leader election over the Lease, taints and "
            "Events on Nodes; false: one replica that only publishes on the bus"
        ),
    ] = True
    misses: Annotated[
        float,
        msgspec.Meta(ge=1.5, le=30, description="Heartbeat intervals missed before a node is lost"),
    ] = 3.0
    min_window_seconds: Annotated[
        float, msgspec.Meta(gt=0, le=300, description="Shortest silence that makes a node lost")
    ] = 2.0
    recover_beats: Annotated[
        int, msgspec.Meta(ge=1, le=100, description="Heartbeats in a row that bring a node back")
    ] = 3
    flap_count: Annotated[
        int, msgspec.Meta(ge=2, le=100, description="Losses within flap_seconds that mean flapping")
    ] = 3
    flap_seconds: Annotated[
        float, msgspec.Meta(gt=0, description="Window in which losses are counted")
    ] = 600.0
    stable_seconds: Annotated[
        float,
        msgspec.Meta(
            gt=0, description="Seconds up without a loss before a flapping node is released"
        ),
    ] = 300.0
    restart_grace_seconds: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            le=600,
            description="Seconds a node whose discovery said goodbye (stopped for a rolling "
            "update or a restart) may stay silent before it is lost; 0: no grace",
        ),
    ] = 30.0
    reconnect_grace_seconds: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            le=120,
            description="Seconds the detector judges nobody once it is back on the bus after "
            "losing it (at least one window): agents reconnecting to a restarted NATS server "
            "may wait for the auth callout, up to the server's 10 s authorization timeout",
        ),
    ] = 15.0
    tick_seconds: Annotated[
        float, msgspec.Meta(gt=0, le=5, description="Seconds between judgements")
    ] = 0.25
    alive_poll_seconds: Annotated[
        float,
        msgspec.Meta(
            ge=0.5,
            le=5,
            description="Seconds between the questions to NEURON_ALIVE (one STREAM.INFO "
            "request) about the nodes whose agents beat in ttl mode; a node is found lost up "
            "to this long after its beat's TTL ran out",
        ),
    ] = 1.0
