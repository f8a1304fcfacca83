"""EC2 shapes of the instance types a simulated fleet may hold.

Only what a Node object needs (vCPUs, memory, max pods); the Neuron hardware of each type
lives in ``neuron_dra_common.topology``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    vcpus: int
    memory_gib: int
    max_pods: int = 110


SHAPES: dict[str, Shape] = {
    "inf1.xlarge": Shape(4, 8),
    "inf1.2xlarge": Shape(8, 16),
    "inf1.6xlarge": Shape(24, 48),
    "inf1.24xlarge": Shape(96, 192),
    "inf2.xlarge": Shape(4, 16),
    "inf2.8xlarge": Shape(32, 128),
    "inf2.24xlarge": Shape(96, 384),
    "inf2.48xlarge": Shape(192, 768),
    "trn1.2xlarge": Shape(8, 32),
    "trn1.32xlarge": Shape(128, 512),
    "trn1n.32xlarge": Shape(128, 512),
    "trn2.48xlarge": Shape(192, 2048),
    "trn2u.48xlarge": Shape(192, 2048),
    "trn3.48xlarge": Shape(192, 2048),
    # The name AWS's UltraServer operator guide gives Trn3 UltraServer nodes ("Trn3pds").
    "trn3pds.48xlarge": Shape(192, 2048),
}

# Instance types that come as UltraServers of four nodes.
ULTRASERVER_TYPES = frozenset({"trn2u.48xlarge", "trn3.48xlarge", "trn3pds.48xlarge"})
