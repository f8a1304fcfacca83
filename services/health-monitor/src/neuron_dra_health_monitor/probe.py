"""The node probe: kernel log, error counters and links in; DeviceHealthChanged out.

Every ``log_poll_seconds`` it reads what the kernel log gained; every ``poll_seconds`` it
reads the driver's sysfs (counters, links, UltraServer modes). What changed a device's
faults (see :mod:`~neuron_dra_health_monitor.probestate`) is published in order; an event
that could not be published is kept and sent again on the next round, before anything newer.
Only once everything is published does the probe save its position in the kernel log and its
counter baselines (:class:`ProbeState`), so a crash between reading and publishing reads
again rather than loses.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import msgspec
from neuron_dra_common.bus import Publisher, PublishError
from neuron_dra_common.driver import NODE_DEVICE, device_name
from neuron_dra_common.events import DeviceHealthChanged
from neuron_dra_common.hardware.kernlog import KernelLineError, parse_hw_error
from neuron_dra_common.hardware.layout import NodePaths
from neuron_dra_common.hardware.sysfs import SysfsNode, read_sysfs
from neuron_dra_common.telemetry import Counter
from neuron_dra_common.topology import UnknownInstanceType, instance_spec
from neuron_dra_common.topology.adjacency import adjacency

from neuron_dra_health_monitor.counters import (
    compare_totals,
    counter_totals,
    lost_modes,
    missing_links,
)
from neuron_dra_health_monitor.probe_logs import Cursor, KernelLog
from neuron_dra_health_monitor.probestate import LINK_DOWN, Fault, HealthBook

__all__ = ["Probe", "ProbeState", "load_state", "save_state"]

log = logging.getLogger(__name__)

HEALTH_EVENTS = Counter(
    "neuron_dra_health_probe_events",
    "DeviceHealthChanged events published by the node probe, by health and error type",
    ["health", "error_type"],
)
KERNEL_LINES = Counter(
    "neuron_dra_health_probe_kernel_errors",
    "NEURON_HW_ERR kernel log lines read, by outcome (used, unreadable)",
    ["outcome"],
)

ConditionSink = Callable[[dict[str, tuple[str, str, str]]], Awaitable[object]]


class ProbeState(msgspec.Struct, kw_only=True):
    """What the probe keeps across restarts."""

    log: Cursor = msgspec.field(default_factory=dict)
    totals: dict[str, int] | None = None
    #: Per device index, the identity (inode, ctime) of its sysfs directory: a new one means
    #: the driver was reloaded and the device starts over.
    incarnations: dict[str, tuple[int, int]] = msgspec.field(default_factory=dict)
    modes: tuple[int, ...] = ()


def load_state(path: str) -> ProbeState:
    if not path:
        return ProbeState()
    try:
        return msgspec.json.decode(Path(path).read_bytes(), type=ProbeState)
    except FileNotFoundError:
        return ProbeState()
    except (OSError, msgspec.DecodeError) as exc:
        log.warning(
            "probe state unreadable, starting afresh", extra={"path": path, "error": str(exc)}
        )
        return ProbeState()


def save_state(path: str, state: ProbeState) -> None:
    if not path:
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_bytes(msgspec.json.encode(state))
    os.replace(tmp, target)


def _incarnations(root: Path, node: SysfsNode) -> dict[str, tuple[int, int]]:
    paths = NodePaths(root)
    out: dict[str, tuple[int, int]] = {}
    for device in node.devices:
        try:
            st = paths.device(device.index).stat()
        except OSError:
            continue
        out[str(device.index)] = (st.st_ino, st.st_ctime_ns)
    return out


class Probe:
    """One node's probe; :meth:`run` until :meth:`stop`."""

    def __init__(
        self,
        *,
        node: str,
        root: Path,
        kernel_log: KernelLog,
        publisher: Publisher,
        book: HealthBook,
        state: ProbeState,
        state_path: str,
        poll_seconds: float,
        log_poll_seconds: float,
        conditions: ConditionSink | None = None,
        instance_type: str = "",
    ) -> None:
        self.node = node
        self._root = root
        self._log = kernel_log
        self._publisher = publisher
        self.book = book
        self.state = state
        self._state_path = state_path
        self._poll = poll_seconds
        self._log_poll = log_poll_seconds
        self._conditions = conditions
        self._instance_type = instance_type
        self._pending: list[DeviceHealthChanged] = []
        self._conditions_due = True
        self._saved = b""
        self._stop = asyncio.Event()
        self.ready = False
        self.published = 0

    def stop(self) -> None:
        self._stop.set()

    # -- inputs --------------------------------------------------------------------------

    def _queue(self, event: DeviceHealthChanged | None) -> None:
        if event is not None:
            self._pending.append(event)
            self._conditions_due = True

    def read_kernel_log(self, messages: list[str], *, now: datetime) -> None:
        for message in messages:
            try:
                error = parse_hw_error(message)
            except KernelLineError as exc:
                KERNEL_LINES.labels("unreadable").inc()
                log.error("kernel error line not understood", extra={"error": str(exc)})
                continue
            if error is None:
                continue
            KERNEL_LINES.labels("used").inc()
            self._queue(
                self.book.add(
                    device_name(error.device),
                    Fault(
                        error_type=error.error_type,
                        source="kernel",
                        evidence=error.line,
                        core=error.core,
                        since=now,
                    ),
                    now=now,
                )
            )

    def read_sysfs(self, node: SysfsNode, *, now: datetime) -> None:
        state = self.state
        incarnations = _incarnations(self._root, node)
        totals = counter_totals(node.devices)
        reset: set[int] = set()
        if state.totals is not None:
            increases, reset = compare_totals(state.totals, totals)
        else:
            increases = []  # the first read is the baseline
        for key, seen in incarnations.items():
            held = state.incarnations.get(key)
            if held is not None and tuple(held) != seen:
                reset.add(int(key))
        for index in sorted(reset):
            self._queue(
                self.book.clear(
                    device_name(index),
                    sources=("kernel", "counter", "bus"),
                    why="driver reloaded: the device's error counters started over",
                    now=now,
                )
            )
        for inc in increases:
            self._queue(
                self.book.add(
                    device_name(inc.device),
                    Fault(
                        error_type=inc.error_type,
                        source="counter",
                        evidence=inc.evidence,
                        core=inc.core,
                        since=now,
                    ),
                    now=now,
                )
            )
        self._links(node, now=now)
        state.totals = totals
        state.incarnations = incarnations

    def _links(self, node: SysfsNode, *, now: datetime) -> None:
        kind = self._instance_type or (node.product_name or "")
        try:
            spec = instance_spec(kind)
        except UnknownInstanceType:
            return
        missing = missing_links(adjacency(spec), node.devices)
        for device in node.devices:
            name = device_name(device.index)
            gone = missing.get(device.index)
            if gone:
                listed = ", ".join(str(d) for d in gone)
                self._queue(
                    self.book.add(
                        name,
                        Fault(
                            error_type=LINK_DOWN,
                            source="link",
                            evidence=f"neuron{device.index} connected_devices lacks {listed}",
                            since=now,
                        ),
                        now=now,
                    )
                )
            else:
                self._queue(
                    self.book.clear(
                        name,
                        sources=("link", "bus"),
                        error_type=LINK_DOWN,
                        why="NeuronLink up again",
                        now=now,
                    )
                )
        us = node.ultraserver
        if us is None or not us.supported_modes:
            return
        offered = tuple(sorted(set(self.state.modes) | set(us.supported_modes)))
        lost = lost_modes(offered, us.supported_modes)
        self.state.modes = offered
        if lost:
            now_modes = ",".join(map(str, us.supported_modes))
            self._queue(
                self.book.add(
                    NODE_DEVICE,
                    Fault(
                        error_type=LINK_DOWN,
                        source="link",
                        evidence=f"ultraserver_mode {','.join(map(str, offered))} -> {now_modes}",
                        since=now,
                    ),
                    now=now,
                )
            )
        else:
            self._queue(
                self.book.clear(
                    NODE_DEVICE,
                    sources=("link", "bus"),
                    error_type=LINK_DOWN,
                    why="UltraServer links up again",
                    now=now,
                )
            )

    # -- outputs -------------------------------------------------------------------------

    async def flush(self) -> bool:
        """Publish what is pending, in order; save the state once all of it is out."""
        while self._pending:
            event = self._pending[0]
            stamp = event.observed_at.isoformat() if event.observed_at else ""
            try:
                await self._publisher.publish(
                    event, msg_id=f"health/{event.node}/{event.device}/{event.health}/{stamp}"
                )
            except PublishError as exc:
                log.error("health publish failed, retrying", extra={"error": str(exc)})
                return False
            self._pending.pop(0)
            self.published += 1
            HEALTH_EVENTS.labels(event.health, event.error_type or "none").inc()
            log.warning(
                "device health changed",
                extra={
                    "node": event.node,
                    "device": event.device,
                    "health": event.health,
                    "error_type": event.error_type,
                    "severity": event.severity,
                    "evidence": event.evidence,
                },
            )
        self.state.log = self._log.cursor
        encoded = msgspec.json.encode(self.state)
        if encoded != self._saved:
            await asyncio.to_thread(save_state, self._state_path, self.state)
            self._saved = encoded
        if self._conditions is not None and self._conditions_due:
            try:
                await self._conditions(self.book.node_conditions())
                self._conditions_due = False
            except Exception as exc:  # the API may be away; the next round tries again
                log.error("node conditions not written", extra={"error": repr(exc)})
        return True

    async def tick_log(self) -> None:
        try:
            messages = await asyncio.to_thread(self._log.read_new)
        except OSError as exc:
            log.error("kernel log unreadable", extra={"error": str(exc)})
            return
        self.read_kernel_log(messages, now=datetime.now(UTC))

    async def tick_sysfs(self) -> None:
        try:
            node = await asyncio.to_thread(read_sysfs, self._root)
        except Exception as exc:  # odd hardware must never stop the probe
            log.error("sysfs read failed", extra={"error": repr(exc)})
            return
        self.read_sysfs(node, now=datetime.now(UTC))

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_sysfs = 0.0
        try:
            while not self._stop.is_set():
                await self.tick_log()
                if loop.time() >= next_sysfs:
                    await self.tick_sysfs()
                    next_sysfs = loop.time() + self._poll
                if await self.flush():
                    self.ready = True
                try:
                    await asyncio.wait_for(self._stop.wait(), timeout=self._log_poll)
                except TimeoutError:
                    continue
        finally:
            self._log.close()
