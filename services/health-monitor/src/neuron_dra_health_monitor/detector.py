"""The cluster failure detector's rule: heartbeats in, verdicts out (no I/O, no clock).

A timeout with hysteresis, per node:

- **lost** once no heartbeat arrived for ``misses`` of the node's own heartbeat intervals
  (at least ``min_window`` seconds): about 3 s for discovery's 1 s heartbeat, where the
  node lifecycle controller waits about 50 s;
- **recovered** once it sent ``recover_beats`` heartbeats in a row again, none more than a
  window apart (one stray heartbeat does not bring a node back);
- **flapping** when it was declared lost ``flap_count`` times within ``flap_seconds``: it is
  held unschedulable until it stayed up for ``stable_seconds``;
- **restarting** once its agent said goodbye (a heartbeat marked ``stopping``: discovery was
  stopped in an orderly way, for a rolling update or a restart): the next heartbeat may take
  up to ``restart_grace`` seconds, not one window. A heartbeat ends the grace; a grace that
  runs out without one makes the node lost as above, once some heartbeat arrived a full
  interval after the grace (proof that the bus carries them). An agent killed outright says
  nothing and is judged by the usual window.

What the detector cannot see is never taken for a dead node. After :meth:`Detector.resume`
(its own start, a reconnect to the bus, taking over leadership) it judges nobody until a
full window of fresh heartbeats has had time to arrive; and when most of the fleet goes
quiet at once (more than ``quiet_fraction`` of at least ``quiet_min_nodes``, or every node of
two or more: the bus, not the nodes, is the likely cause) it declares nobody and starts that
wait again, as the node lifecycle controller stops evicting in a full disruption. "At once"
is within one heartbeat interval (agents beat out of step), and that wait runs again from
the first heartbeat the bus carries after it (the stream's new leader elected, say). A node
within its restart grace is expected to be silent: it is neither quiet nor counted among the
nodes heard, so nodes restarting during a bus outage do not hide the outage. Nodes it
declared lost before a restart are restored with :meth:`Detector.restore` and stay lost until
they recover by the rule above.

A node whose agent beats in ``ttl`` mode (its last ``NodeHeartbeat``, the hello, carried
``alive_ttl_seconds``) is judged from the bus's answer to "which nodes' alive beats do you
still hold" (:meth:`Detector.answer`): the bus drops a beat when its TTL runs out, so a node
absent from the answer has been silent for its TTL. Present in an answer means a beat within
the TTL; absent and past the node's window (counted from that), it is quiet; absent is also
what "lagging" means for the bus-blaming rule, since one answer is one instant for the whole
fleet. Its recovery needs ``recover_beats`` beats in a row as any node's: the caller reads a
lost node's last beat and hands it to :meth:`Detector.heard`.

Times are seconds on a monotonic clock the caller supplies (``now``); wall-clock times
(``datetime``) only travel along for the events.

>>> d = Detector(DetectorRules(misses=3, min_window=1.0))
>>> d.resume(now=0.0)
>>> d.heard("n1", now=0.0, interval=1.0, sequence=1, boot_id="b")
>>> d.judge(now=2.0)
[]
>>> [v.kind for v in d.judge(now=4.5)]
['lost']

A goodbye buys the node ``restart_grace`` seconds:

>>> d = Detector(DetectorRules(misses=3, min_window=1.0, restart_grace=30.0))
>>> d.resume(now=0.0)
>>> d.heard("n1", now=0.0, interval=1.0, sequence=9, boot_id="b", instance="i1", stopping=True)
>>> [v.kind for v in d.judge(now=0.0)], d.judge(now=20.0)
(['restarting'], [])
>>> d.heard("n1", now=21.0, interval=1.0, sequence=1, boot_id="b", instance="i2")
>>> [v.kind for v in d.judge(now=21.0)]
['restarted']

In ``ttl`` mode the answers decide; a node present in one had a beat within its TTL:

>>> d = Detector(DetectorRules(misses=3, min_window=1.0))
>>> d.resume(now=0.0)
>>> d.heard("n1", now=0.0, interval=1.0, sequence=1, boot_id="b", ttl=3.0)
>>> d.answer({"n1"}, now=2.0)
>>> d.judge(now=2.0), d.judge(now=4.5)
([], [])
>>> d.answer(set(), now=5.0)
>>> [(v.kind, v.reason) for v in d.judge(now=5.0)]
[('lost', 'no heartbeat for 3.0 s (every 1 s expected)')]
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
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
    #: seconds a node whose agent said goodbye may stay silent (0: no grace, the usual rule)
    restart_grace: float = 30.0
    #: seconds to judge nobody after the detector is back on the bus (at least one window):
    #: agents reconnecting to a restarted server may wait for the auth callout meanwhile
    reconnect_grace: float = 0.0


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """A transition the detector decided, to publish (lost/recovered) or act on (hold)."""

    #: lost/recovered: published; hold/release: the flapping taint; restarting/restarted:
    #: the node's agent said goodbye / was heard again within its grace (shown, not published)
    kind: Literal["lost", "recovered", "hold", "release", "restarting", "restarted"]
    node: str
    reason: str = ""
    #: lost: the wall time of the last heartbeat heard from it (None: none since start)
    last_heartbeat_at: datetime | None = None
    #: recovered: how long it was lost (monotonic seconds, or since the restored event);
    #: restarted: how long its agent was away
    lost_for: float = 0.0


@dataclass
class NodeState:
    interval: float
    last: float
    last_wall: datetime | None = None
    boot_id: str = ""
    instance: str = ""
    sequence: int = 0
    #: when its agent said goodbye (None: not restarting); the grace runs from here
    stopping_since: float | None = None
    #: > 0: the agent's beats live this many seconds on the bus (ttl mode), judged by answers
    ttl: float = 0.0
    #: ttl mode: missing from the bus's last answer
    absent: bool = False
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
        #: restarting / restarted transitions heard since the last judgement
        self._heard: list[Verdict] = []
        #: when the last heartbeat of any node arrived (proof that the bus carries them)
        self._heard_at = float("-inf")
        #: the fleet went quiet at once and the bus was blamed: until a heartbeat comes
        self._bus_blamed = False

    # --- inputs --------------------------------------------------------------------------

    def resume(self, *, now: float, reconnected: bool = False) -> None:
        """Judge nobody for one full window from ``now`` (after a start, a reconnect, a
        takeover, or a silence of the whole fleet), then judge again; ``reconnected`` (back on
        the bus after losing it): for ``reconnect_grace`` if that is longer."""
        wait = self._longest_window()
        if reconnected:
            wait = max(wait, self.rules.reconnect_grace)
        self._judging_from = now + wait
        for state in self.nodes.values():
            # Silence before ``now`` was the detector's blindness, not the node's.
            state.last = max(state.last, now)

    def restore(self, node: str, *, lost: bool, now: float, lost_for: float = 0.0) -> None:
        """What the detector's own last event said of ``node`` before a restart."""
        state = self._state(node, now=now, interval=0.0)
        state.lost = lost
        state.streak = 0
        state.lost_since = now - lost_for if lost else 0.0

    def known(
        self, node: str, *, now: float, interval: float, stopping: bool = False, ttl: float = 0.0
    ) -> None:
        """``node`` sent heartbeats before the detector started (the stream's last one): it
        is expected to send more, and is judged from ``now`` on like any other. ``stopping``:
        that last one was a goodbye, so its agent is restarting; it gets the whole grace from
        ``now`` (when it said goodbye is the node's clock, not ours)."""
        state = self._state(node, now=now, interval=interval)
        state.ttl = ttl
        if stopping and not state.lost and self.rules.restart_grace > 0:
            # Already told before the restart: no second "restarting".
            state.stopping_since = now

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
        instance: str = "",
        stopping: bool = False,
        ttl: float | None = None,
    ) -> None:
        """A heartbeat of ``node`` arrived. A repeat (same boot and process, a sequence not
        newer than one heard) is ignored: a redelivery says nothing about now. ``stopping``:
        the agent's goodbye; the node is restarting until its next heartbeat. ``ttl``: what
        a ``NodeHeartbeat`` says of the agent's mode (> 0: ttl mode); None (an alive beat read
        back from the bus) leaves it as it is."""
        state = self._state(node, now=now, interval=interval)
        if ttl is not None:
            state.ttl = ttl
        same_process = boot_id == state.boot_id and instance == state.instance
        if same_process and 0 < sequence <= state.sequence:
            return
        if self._bus_blamed:
            # The bus carries heartbeats again: the others' may trail this one by up to an
            # interval (and a publish retried across the outage), so the window starts here.
            self._bus_blamed = False
            self.resume(now=now)
        gap = now - state.last
        # A goodbye from another process than the one that said it before: that one came
        # back unheard and is leaving in its turn; the grace starts again.
        again = state.stopping_since is not None and instance != state.instance
        state.boot_id, state.instance, state.sequence = boot_id, instance, sequence
        state.interval = interval or state.interval
        state.last = now
        state.last_wall = sent_at or state.last_wall
        self._heard_at = max(self._heard_at, now)
        if stopping and self.rules.restart_grace > 0:
            if state.lost:
                # Lost and leaving again: its recovery starts over with the next agent.
                state.streak = 0
            elif state.stopping_since is None or again:
                self._restarting(node, state, now=now)
            return
        if state.stopping_since is not None:
            away = now - state.stopping_since
            state.stopping_since = None
            self._heard.append(Verdict(kind="restarted", node=node, lost_for=away))
        if state.lost:
            state.streak = state.streak + 1 if gap <= self.window(state) else 1

    def answer(self, present: Collection[str], *, now: float, wall: datetime | None = None) -> None:
        """The bus's answer at ``now``: the ttl-mode nodes whose last alive beat it still
        holds are ``present``; every other ttl-mode node is absent. A present node beat
        within its TTL; one that just went absent beat no later than its TTL before ``now``,
        which is when its silence is counted from (and, with ``wall``, the answer's wall
        time, what a NodeLost says of its last heartbeat)."""
        for name, state in self.nodes.items():
            if state.ttl <= 0:
                continue
            if name not in present:
                if not state.absent:
                    state.absent = True
                    state.last = max(state.last, now - state.ttl)
                    if wall is not None:
                        state.last_wall = wall - timedelta(seconds=state.ttl)
                continue
            if self._bus_blamed:
                # As for a heartbeat: the bus carries beats again, the window starts here.
                self._bus_blamed = False
                self.resume(now=now)
            state.absent = False
            state.last = max(state.last, now - state.ttl)
            self._heard_at = max(self._heard_at, now)

    # --- the rule ------------------------------------------------------------------------

    def window(self, state: NodeState) -> float:
        return max(self.rules.misses * state.interval, self.rules.min_window)

    def in_grace(self, state: NodeState, *, now: float) -> bool:
        """Whether ``state``'s agent said goodbye and its restart grace still runs."""
        return (
            state.stopping_since is not None
            and now - state.stopping_since <= self.rules.restart_grace
        )

    def judging(self, *, now: float) -> bool:
        return self._judging_from is not None and now >= self._judging_from

    def judge(self, *, now: float) -> list[Verdict]:
        """The verdicts due at ``now``, each given once."""
        out, self._heard = self._heard, []
        if not self.judging(now=now):
            return out
        # A node silent by announcement (in its restart grace, or past it while the bus has
        # not yet shown that it carries heartbeats) is not judged, and it does not count among
        # the nodes whose silence at once would blame the bus.
        up = sum(1 for s in self.nodes.values() if not s.lost)
        alone = up <= 1
        judged = {
            name: s
            for name, s in self.nodes.items()
            if not s.lost and not self._awaited(s, now=now, alone=alone)
        }
        quiet = [name for name, s in judged.items() if self._quiet(s, now=now)]
        # "At once" is within one heartbeat: agents beat out of step, so when the bus stops
        # carrying heartbeats the fleet goes quiet over one interval, not in one judgement.
        lagging = sum(1 for s in judged.values() if self._lagging(s, now=now))
        alive = len(judged)
        waiting = up - alive
        rules = self.rules
        everyone = alive >= 1 and alive + waiting >= 2 and lagging == alive
        most = alive >= rules.quiet_min_nodes and lagging > rules.quiet_fraction * alive
        if quiet and (everyone or most):
            # Most of the fleet at once: the bus or this process stalled, not the nodes.
            self.resume(now=now)
            self._bus_blamed = True
            return out
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

    def restarting(self) -> list[str]:
        """Nodes whose agent said goodbye and was not heard since (nor declared lost)."""
        return sorted(n for n, s in self.nodes.items() if s.stopping_since is not None)

    # --- pieces ----------------------------------------------------------------------------

    def _awaited(self, state: NodeState, *, now: float, alone: bool) -> bool:
        """Silent by announcement: in its restart grace, or silent past it while the bus has
        not carried any heartbeat a full interval after the grace. A bus outage just as the
        grace ends would otherwise cost a node that is back; and such a node, neither quiet
        nor heard, must not make the rest of the fleet look heard while the bus is out. A node
        alone waits for no proof (its grace ends when nobody else's deadline does)."""
        if self.in_grace(state, now=now):
            return True
        if state.stopping_since is None or alone or now - state.last <= self.window(state):
            return False
        proof = state.stopping_since + self.rules.restart_grace + state.interval
        return self._heard_at < proof

    def _quiet(self, state: NodeState, *, now: float) -> bool:
        """Silent past its deadline (a node :meth:`_awaited` is not judged at all); in ttl
        mode only once the bus no longer holds its beat either."""
        if state.ttl > 0:
            # Counted from the latest its last beat can have been: due at the first answer
            # without it when the window is the TTL.
            return state.absent and now - state.last >= self.window(state) - 1e-9
        return now - state.last > self.window(state)

    def _lagging(self, state: NodeState, *, now: float) -> bool:
        """Quiet, or will be before its next heartbeat is due (silent past its deadline less
        one interval); in ttl mode, absent from the bus's last answer."""
        if state.ttl > 0:
            return state.absent
        return now - state.last > self.window(state) - state.interval

    def _restarting(self, name: str, state: NodeState, *, now: float) -> None:
        state.stopping_since = now
        self._heard.append(
            Verdict(
                kind="restarting",
                node=name,
                reason=f"its agent is stopping; waiting up to {self.rules.restart_grace:g} s "
                "for its next heartbeat",
            )
        )

    def _lose(self, name: str, *, now: float) -> list[Verdict]:
        state = self.nodes[name]
        silent = now - state.last
        if state.stopping_since is not None:
            reason = (
                f"no heartbeat for {silent:.1f} s since its agent said it was stopping "
                f"(restart grace {self.rules.restart_grace:g} s)"
            )
        else:
            reason = f"no heartbeat for {silent:.1f} s (every {state.interval:g} s expected)"
        state.lost, state.lost_since, state.streak = True, now, 0
        state.stopping_since = None
        out = [
            Verdict(
                kind="lost",
                node=name,
                reason=reason,
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
