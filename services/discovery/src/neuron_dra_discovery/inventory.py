"""When discovery publishes, and under which message id (no I/O).

* **Change**: a read whose *description* differs from the last one published is published at
  once. The description is everything the node is (devices, links, ids, versions, LNC,
  problems) but not its running statistics (ECC and per-core counters), which move all the
  time and belong to the health monitor; they still ride along with every inventory sent.
* **Heartbeat**: the full inventory is sent again every ``heartbeat_seconds`` with the same
  ``generation``, so a consumer that lost its state (or a stream that was recreated) catches
  up without the node changing.
* **De-duplication by content**: the ``Nats-Msg-Id`` is ``inventory/<node>/<digest>/<epoch>/
  <change>``: the description's digest, the heartbeat period the publish falls in, and how many
  changes this process has seen. JetStream drops a second publish with that id inside its
  duplicate window, so a restarted agent (or a retried publish) that sends the same content
  in the same period stores nothing new, while a heartbeat in the next period, and a change
  back to an earlier content (``A -> B -> A``), are stored.
* ``generation`` is the wall-clock millisecond at which the content was first seen, kept
  increasing, so it also orders inventories across restarts of the agent.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

import msgspec
from neuron_dra_common.events import NodeInventory
from neuron_dra_common.hardware.model import EccCounters, NodeHardware

__all__ = ["Decision", "Tracker", "description_digest"]


def _description(hardware: NodeHardware) -> NodeHardware:
    devices = tuple(
        msgspec.structs.replace(d, ecc=EccCounters(), cores=()) for d in hardware.devices
    )
    return msgspec.structs.replace(hardware, devices=devices)


def description_digest(*, node: str, hardware: NodeHardware, dra_driver_version: str) -> str:
    """A digest of what the node is, statistics left out."""
    body = msgspec.json.encode(
        {"node": node, "hardware": _description(hardware), "dra": dra_driver_version},
        order="deterministic",
    )
    return hashlib.sha256(body).hexdigest()


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """An inventory to publish now, with its de-duplication id, and why."""

    event: NodeInventory
    msg_id: str
    reason: str  # "start", "change" or "heartbeat"


class Tracker:
    """Remembers what was published last and decides about each new read.

    >>> tracker = Tracker(node="n1", boot_id="b", heartbeat_seconds=60, dra_driver_version="1")
    >>> tracker.observe(hardware, now=now).reason
    'start'
    """

    def __init__(
        self, *, node: str, boot_id: str, heartbeat_seconds: float, dra_driver_version: str
    ) -> None:
        self.node = node
        self.boot_id = boot_id
        self.heartbeat_seconds = heartbeat_seconds
        self.dra_driver_version = dra_driver_version
        self._digest = ""
        self._generation = 0
        self._changes = 0
        self._last_sent: float | None = None

    @property
    def generation(self) -> int:
        return self._generation

    def observe(self, hardware: NodeHardware, *, now: datetime) -> Decision | None:
        """The publish this read calls for, if any."""
        stamp = now.timestamp()
        digest = description_digest(
            node=self.node, hardware=hardware, dra_driver_version=self.dra_driver_version
        )
        if digest != self._digest:
            reason = "start" if not self._digest else "change"
            if self._digest:
                self._changes += 1
            self._digest = digest
            self._generation = max(self._generation + 1, int(stamp * 1000))
        elif self._last_sent is not None and stamp - self._last_sent < self.heartbeat_seconds:
            return None
        else:
            reason = "heartbeat"
        self._last_sent = stamp
        epoch = int(stamp // self.heartbeat_seconds)
        event = NodeInventory(
            node=self.node,
            boot_id=self.boot_id,
            generation=self._generation,
            hardware=hardware,
            dra_driver_version=self.dra_driver_version,
            observed_at=now,
        )
        msg_id = f"inventory/{self.node}/{digest[:32]}/{epoch}/{self._changes}"
        return Decision(event=event, msg_id=msg_id, reason=reason)

    def forget_sent(self) -> None:
        """The last publish failed: send again on the next read."""
        self._last_sent = None
