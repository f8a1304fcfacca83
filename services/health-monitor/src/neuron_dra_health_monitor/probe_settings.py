"""The node probe's settings; every field also reads ``NEURON_DRA_<FIELD>``."""

from __future__ import annotations

from typing import Annotated

import msgspec
from neuron_dra_common.settings import NodeHardwareSettings

__all__ = ["ProbeSettings"]


class ProbeSettings(NodeHardwareSettings, frozen=True, kw_only=True):
    """Watches this node's Neuron hardware for errors and publishes DeviceHealthChanged."""

    kernel_log: Annotated[
        str,
        msgspec.Meta(
            description="Kernel log to follow: /dev/kmsg (a character device, read as kmsg "
            "records) or a text file such as /var/log/kern.log"
        ),
    ] = "/dev/kmsg"
    poll_seconds: Annotated[
        float, msgspec.Meta(gt=0, description="Seconds between reads of the error counters")
    ] = 5.0
    log_poll_seconds: Annotated[
        float, msgspec.Meta(gt=0, description="Seconds between reads of the kernel log")
    ] = 0.2
    state_path: Annotated[
        str,
        msgspec.Meta(
            description="File where the probe keeps its kernel log position and counter "
            "baselines across restarts; empty: keep nothing"
        ),
    ] = "/var/lib/neuron-dra/health-probe/state.json"
    kubeconfig: Annotated[
        str, msgspec.Meta(description="kubeconfig file; empty: KUBECONFIG, else in-cluster")
    ] = ""
    node_conditions: Annotated[
        bool, msgspec.Meta(description="Write the NeuronHealth condition on this node's Node")
    ] = True
    accelerated_hardware_condition: Annotated[
        bool,
        msgspec.Meta(
            description="Also write AcceleratedHardwareReady (turn off where the EKS node "
            "monitoring agent runs and owns it)"
        ),
    ] = True
