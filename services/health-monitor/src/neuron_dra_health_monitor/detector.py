"""The cluster failure detector's rule: heartbeats in, verdicts out (no I/O, no clock).

A timeout with hysteresis, per node:

- **lost** once no heartbeat arrived for ``misses`` of the node's own heartbeat intervals
  (at least ``min_window`` seconds): about 3 s for discovery's 1 s heartbeat, where the
  node lifecycle controller waits about 50 s;
- **recovered** once it sent ``recover_beats`` heartbeats in a row again, none more than a
  window apart (one stray heartbeat does not bring a node back);
- **flapping** when it was declared lost ``flap_count`` times within ``flap_seconds``: it is
  held unschedulable until it stayed up for ``stable_seconds``.

What the detector cannot see is never taken for a dead node. After :meth:`Detector.resume`
(its own start, a reconnect to the bus, taking over leadership) it judges nobody until a
full window of fresh heartbeats has had time to arrive; and when most of the fleet goes
quiet at once (more than ``quiet_fraction`` of at least ``quiet_min_nodes``, or every node of
two or more: the bus, not the nodes, is the likely cause) it declares nobody and starts that
wait again, as the node lifecycle controller stops evicting in a full disruption. Nodes it declared lost before a restart are restored with
:meth:`Detector.restore` and stay lost until they recover by the rule above.

Times are seconds on a monotonic clock the caller supplies (``now``); wall-clock times
(``datetime``) only travel along for the events.

>>> d = Detector(DetectorRules(misses=3, min_window=1.0))
>>> d.resume(now=0.0)
>>> d.heard("n1", now=0.0, interval=1.0, sequence=1, boot_id="b")
>>> d.judge(now=2.0)
[]
>>> [v.kind for v in d.judge(now=4.5)]
['lost']
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import msgspec

__all__ = ["Detector", "DetectorRules", "NodeState", "Verdict"]


class DetectorRules(msgspec.Struct, frozen=True, kw_only=True):
    """The rule's knobs (see the module docstring)."""

    misses: float = 3.0
    min_window: float = 2.0
    recover_beats: int = 3
    flap_count: int = 3
    flap_seconds: float = 600.0
    stable_seconds: float = 300.0
    #: above this share of the known nodes going quiet in one judgement, blame the bus
    quiet_fraction: float = 0.5
    #: ... but only once at least this many nodes are known (a fleet of 2 can lose 1)
    quiet_min_nodes: int = 4


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """A transition the detector decided, to publish (lost/recovered) or act on (hold)."""

    kind: Literal["lost", "recovered", "hold", "release"]
    node: str
    reason: str = ""
    #: lost: the wall time of the last heartbeat heard from it (None: none since start)
    last_heartbeat_at: datetime | None = None
    #: recovered: how long it was lost (monotonic seconds, or since the restored event)
    lost_for: float = 0.0


@dataclass
class NodeState:
    interval: float
    last: float
    last_wall: datetime | None = None
    boot_id: str = ""
    sequence: int = 0
    lost: bool = False
    lost_since: float = 0.0
    #: heartbeats in a row since it was declared lost
    streak: int = 0
    losses: deque[float] = field(default_factory=deque)
    held: bool = False
    up_since: float = 0.0


class Detector:
    """Per-node heartbeat bookkeeping and the rule that turns it into verdicts."""

    def __init__(self, rules: DetectorRules | None = None) -> None:
        self.rules = rules or DetectorRules()
        self.nodes: dict[str, NodeState] = {}
        self._judging_from: float | None = None

    # --- inputs --------------------------------------------------------------------------

    def resume(self, *, now: float) -> None:
        """Judge nobody for one full window from ``now`` (after a start, a reconnect, a
        takeover, or a silence of the whole fleet), then judge again."""
        self._judging_from = now + self._longest_window()
        for state in self.nodes.values():
            # Silence before ``now`` was the detector's blindness, not the node's.
            state.last = max(state.last, now)

    def restore(self, node: str, *, lost: bool, now: float, lost_for: float = 0.0) -> None:
        """What the detector's own last event said of ``node`` before a restart."""
        state = self._state(node, now=now, interval=0.0)
        state.lost = lost
        state.streak = 0
        state.lost_since = now - lost_for if lost else 0.0

    def known(self, node: str, *, now: float, interval: float) -> None:
        """``node`` sent heartbeats before the detector started (the stream's last one): it
        is expected to send more, and is judged from ``now`` on like any other."""
        self._state(node, now=now, interval=interval)

    def hold(self, node: str, *, now: float) -> None:
        """``node`` is held unschedulable already (seen on the cluster at start)."""
        state = self._state(node, now=now, interval=0.0)
        state.held = True
        state.up_since = now

    def heard(
        self,
        node: str,
        *,
        now: float,
        interval: float,
        sequence: int,
        boot_id: str,
        sent_at: datetime | None = None,
    ) -> None:
        """A heartbeat of ``node`` arrived. A repeat (same boot and process, a sequence not
        newer than one heard) is ignored: a redelivery says nothing about now."""
        state = self._state(node, now=now, interval=interval)
        if boot_id == state.boot_id and 0 < sequence <= state.sequence:
            return
        gap = now - state.last
        state.boot_id, state.sequence = boot_id, sequence
        state.interval = interval or state.interval
        state.last = now
        state.last_wall = sent_at or state.last_wall
        if state.lost:
            state.streak = state.streak + 1 if gap <= self.window(state) else 1

    # --- the rule ------------------------------------------------------------------------

    def window(self, state: NodeState) -> float:
        return max(self.rules.misses * state.interval, self.rules.min_window)

    def judging(self, *, now: float) -> bool:
        return self._judging_from is not None and now >= self._judging_from

    def judge(self, *, now: float) -> list[Verdict]:
        """The verdicts due at ``now``, each given once."""
        if not self.judging(now=now):
            return []
        quiet = [
            name for name, s in self.nodes.items() if not s.lost and now - s.last > self.window(s)
        ]
        alive = sum(1 for s in self.nodes.values() if not s.lost)
        rules = self.rules
        everyone = alive >= 2 and len(quiet) == alive
        most = alive >= rules.quiet_min_nodes and len(quiet) > rules.quiet_fraction * alive
        if everyone or most:
            # Most of the fleet at once: the bus or this process stalled, not the nodes.
            self.resume(now=now)
            return []
        out: list[Verdict] = []
        for name in quiet:
            out += self._lose(name, now=now)
        for name, state in self.nodes.items():
            if state.lost and state.streak >= rules.recover_beats:
                out += self._recover(name, state, now=now)
            elif state.held and not state.lost and now - state.up_since >= rules.stable_seconds:
                state.held = False
                out.append(
                    Verdict(
                        kind="release",
                        node=name,
                        reason=f"up for {rules.stable_seconds:.0f} s without a loss",
                    )
                )
        return out

    def lost(self) -> list[str]:
        return sorted(n for n, s in self.nodes.items() if s.lost)

    def held(self) -> list[str]:
        return sorted(n for n, s in self.nodes.items() if s.held)

    # --- pieces ----------------------------------------------------------------------------

    def _lose(self, name: str, *, now: float) -> list[Verdict]:
        state = self.nodes[name]
        silent = now - state.last
        state.lost, state.lost_since, state.streak = True, now, 0
        out = [
            Verdict(
                kind="lost",
                node=name,
                reason=f"no heartbeat for {silent:.1f} s (every {state.interval:g} s expected)",
                last_heartbeat_at=state.last_wall,
            )
        ]
        state.losses.append(now)
        while state.losses and now - state.losses[0] > self.rules.flap_seconds:
            state.losses.popleft()
        if not state.held and len(state.losses) >= self.rules.flap_count:
            state.held = True
            out.append(
                Verdict(
                    kind="hold",
                    node=name,
                    reason=f"lost {len(state.losses)} times in "
                    f"{self.rules.flap_seconds:.0f} s; held until up for "
                    f"{self.rules.stable_seconds:.0f} s",
                )
            )
        return out

    def _recover(self, name: str, state: NodeState, *, now: float) -> list[Verdict]:
        state.lost, state.streak = False, 0
        state.up_since = now
        return [Verdict(kind="recovered", node=name, lost_for=now - state.lost_since)]

    def _state(self, node: str, *, now: float, interval: float) -> NodeState:
        state = self.nodes.get(node)
        if state is None:
            state = self.nodes[node] = NodeState(interval=interval or 1.0, last=now)
        return state

    def _longest_window(self) -> float:
        windows: Iterable[float] = (self.window(s) for s in self.nodes.values())
        return max(windows, default=self.rules.min_window)
