"""The topology allocator's settings; every field also reads ``NEURON_DRA_<FIELD>``."""

from __future__ import annotations

from typing import Annotated

import msgspec
from neuron_dra_common.bus import ALLOCATOR_SUBJECT
from neuron_dra_common.settings import ServiceSettings

from neuron_dra_topology_allocator.placement import Strategy

__all__ = ["AllocatorSettings"]


class AllocatorSettings(ServiceSettings, frozen=True, kw_only=True):
    """The topology allocator: whole-UltraServer placement over NATS request/reply."""

    strategy: Annotated[Strategy, msgspec.Meta(description="Placement: best-fit or first-fit")] = (
        Strategy.BEST_FIT
    )
    subject: Annotated[str, msgspec.Meta(description="Request subject")] = ALLOCATOR_SUBJECT
