"""One writer for every pool: the shared Lease elector (:mod:`neuron_dra_common.kube.leader`).

The replica holding the ``neuron-dra-slice-publisher`` Lease (or a share's, see
:mod:`neuron_dra_slice_publisher.partitions`) consumes inventories and writes those pools; the
others wait. Such a write still uses the slice's resourceVersion, so one in flight
when the Lease changes hands cannot overwrite the new leader's.
"""

from __future__ import annotations

from neuron_dra_common.kube.leader import LEASES, Elector, LeaseState, decide, read_lease

__all__ = ["LEASES", "Elector", "LeaseState", "decide", "read_lease"]
