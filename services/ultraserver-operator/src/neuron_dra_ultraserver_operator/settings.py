"""The UltraServer operator's settings; every field also reads ``NEURON_DRA_<FIELD>``
(e.g. ``NEURON_DRA_CLAIM_WAIT_SECONDS``)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from neuron_dra_common.bus import ALLOCATOR_SUBJECT
from neuron_dra_common.settings import LeaderElectedSettings

__all__ = ["OperatorSettings"]


class OperatorSettings(LeaderElectedSettings, frozen=True, kw_only=True):
    """The UltraServer operator."""

    lease_name: Annotated[str, msgspec.Meta(min_length=1, description="Lease name")] = (
        "neuron-dra-ultraserver-operator"
    )
    allocator_subject: Annotated[str, msgspec.Meta(description="Allocator subject")] = (
        ALLOCATOR_SUBJECT
    )
    allocator_timeout: Annotated[
        float, msgspec.Meta(gt=0, description="Seconds to wait for an allocator answer")
    ] = 10.0
    claim_wait_seconds: Annotated[
        float, msgspec.Meta(gt=0, description="Longest wait for claims to go on delete")
    ] = 300.0
    resync_seconds: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="Every workload is reconciled again this often, events or not: its "
            "ownership is checked against what Kubernetes records and confirmed with the "
            "allocator (which may have restarted without its history)",
        ),
    ] = 60.0
    workload_workers: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            le=256,
            description="Workloads reconciled at once (each workload by one at a time; the "
            "allocator decides, one request after another, which UltraServers each gets)",
        ),
    ] = 32
