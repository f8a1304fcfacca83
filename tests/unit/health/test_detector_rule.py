"""The failure detector's rule over simulated time: when a node is lost, recovered, held."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from neuron_dra_health_monitor.detector import Detector, DetectorRules

RULES = DetectorRules(
    misses=3, min_window=2.0, recover_beats=3, flap_count=3, flap_seconds=60.0, stable_seconds=30.0
)


class Fleet:
    """Nodes sending heartbeats every second, as discovery does, and a detector hearing them."""

    def __init__(self, nodes: int, *, rules: DetectorRules = RULES) -> None:
        self.names = [f"n{i}" for i in range(nodes)]
        self.detector = Detector(rules)
        self.up = set(self.names)
        self.now = 0.0
        self.seq = 0
        self.verdicts: list[tuple[float, str, str]] = []
        self.detector.resume(now=0.0)

    def run(self, seconds: float, *, hear: bool = True) -> None:
        """Advance in steps of 0.25 s; every whole second each node that is up beats."""
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.now = round(self.now + 0.25, 2)
            if hear and self.now == int(self.now):
                self.seq += 1
                for name in sorted(self.up):
                    self.detector.heard(
                        name, now=self.now, interval=1.0, sequence=self.seq, boot_id="b"
                    )
            for v in self.detector.judge(now=self.now):
                self.verdicts.append((self.now, v.kind, v.node))

    def kinds(self, node: str) -> list[str]:
        return [k for _, k, n in self.verdicts if n == node]


def test_a_silent_node_is_lost_after_three_intervals_and_only_it() -> None:
    fleet = Fleet(6)
    fleet.run(10)
    fleet.up.discard("n2")
    fleet.run(10)
    assert [(k, n) for _, k, n in fleet.verdicts] == [("lost", "n2")]
    (when,) = [t for t, k, _ in fleet.verdicts]
    assert 10 + 3 <= when <= 10 + 4.25  # 3 missed beats, judged every 0.25 s


def test_it_recovers_after_three_beats_in_a_row_not_one() -> None:
    fleet = Fleet(6)
    fleet.run(5)
    fleet.up.discard("n1")
    fleet.run(6)
    fleet.up.add("n1")
    fleet.run(1.0)  # one heartbeat: still lost
    assert fleet.kinds("n1") == ["lost"]
    fleet.run(3)
    assert fleet.kinds("n1") == ["lost", "recovered"]


def test_nobody_is_judged_before_one_window_after_start_or_resume() -> None:
    fleet = Fleet(2)
    fleet.detector.restore("n0", lost=False, now=0.0)
    # Restarted detector: nodes known from before are silent for the first 2 s (the bus
    # is slow to deliver): nobody is declared lost.
    fleet.run(1.75, hear=False)
    assert fleet.verdicts == []
    fleet.run(10)
    assert fleet.verdicts == []


def test_the_whole_fleet_going_quiet_is_blamed_on_the_bus() -> None:
    fleet = Fleet(8)
    fleet.run(5)
    fleet.run(20, hear=False)  # a NATS restart: no heartbeat reaches the detector
    assert fleet.verdicts == []
    fleet.run(10)  # back: nothing happened to any node
    assert fleet.verdicts == []


def test_a_fleet_beating_out_of_step_going_quiet_is_blamed_on_the_bus() -> None:
    """Agents beat at their own moments within the second: when the bus stops carrying
    heartbeats (its stream's server killed, a new leader not yet elected) each node's
    deadline passes at a different tick, a few nodes at a time, yet none is lost; a node
    going silent alone among them still is."""
    detector = Detector(RULES)
    detector.resume(now=0.0)
    names = [f"n{i}" for i in range(30)]
    verdicts = []

    def run(start: float, end: float, *, beating: list[str], silent: tuple[float, float]) -> None:
        for step in range(int(start * 4) + 1, int(end * 4) + 1):
            now = step / 4
            for i, name in enumerate(names):
                at = now - (now - i / 30) % 1.0  # this node's last beat moment, i/30 s in
                if name in beating and now - 0.25 < at <= now and not silent[0] < at < silent[1]:
                    detector.heard(name, now=at, interval=1.0, sequence=int(at), boot_id="b")
            verdicts.extend(detector.judge(now=now))

    # Heard until 10 s, then nothing for 8 s (a leader election), then heard again.
    run(0, 30, beating=names, silent=(10, 18))
    assert verdicts == []
    run(30, 40, beating=names[1:], silent=(0, 0))
    assert [(v.kind, v.node) for v in verdicts] == [("lost", "n0")]


def test_a_fleet_of_two_going_quiet_together_is_not_declared_lost() -> None:
    fleet = Fleet(2)
    fleet.run(5)
    fleet.run(20, hear=False)
    assert fleet.verdicts == []


def test_a_node_lost_before_a_restart_stays_lost_until_it_recovers() -> None:
    detector = Detector(RULES)
    detector.restore("n0", lost=True, now=100.0, lost_for=30.0)
    detector.resume(now=100.0)
    assert detector.judge(now=110.0) == []
    assert detector.lost() == ["n0"]
    for i in range(1, 4):
        detector.heard("n0", now=110.0 + i, interval=1.0, sequence=i, boot_id="b")
    (verdict,) = detector.judge(now=113.5)
    assert verdict.kind == "recovered"
    assert verdict.lost_for >= 40.0


def test_a_redelivered_heartbeat_does_not_count() -> None:
    detector = Detector(RULES)
    detector.resume(now=0.0)
    detector.heard("n0", now=0.0, interval=1.0, sequence=5, boot_id="b")
    for t in (3.0, 4.0, 5.0):  # the same heartbeat again (a redelivery after a restart)
        detector.heard("n0", now=t, interval=1.0, sequence=5, boot_id="b")
    assert [v.kind for v in detector.judge(now=5.0)] == ["lost"]


def test_a_flapping_node_is_held_until_stable_then_released() -> None:
    fleet = Fleet(6)
    fleet.run(3)
    for _ in range(3):
        fleet.up.discard("n3")
        fleet.run(5)
        fleet.up.add("n3")
        fleet.run(5)
    assert fleet.kinds("n3") == [
        "lost",
        "recovered",
        "lost",
        "recovered",
        "lost",
        "hold",
        "recovered",
    ]
    assert fleet.detector.held() == ["n3"]
    recovered = max(t for t, k, n in fleet.verdicts if n == "n3" and k == "recovered")
    fleet.run(recovered + 29 - fleet.now)
    assert "release" not in fleet.kinds("n3")
    fleet.run(1.5)
    assert fleet.kinds("n3")[-1] == "release"
    assert fleet.detector.held() == []


@settings(max_examples=60, deadline=None)
@given(
    outages=st.lists(
        st.tuples(st.integers(0, 5), st.floats(0, 30), st.floats(0.5, 12)), max_size=6
    ),
    bus_gaps=st.lists(st.tuples(st.floats(0, 40), st.floats(0.5, 15)), max_size=3),
)
def test_lost_exactly_when_silent_long_enough_never_because_the_bus_was(
    outages: list[tuple[int, float, float]], bus_gaps: list[tuple[float, float]]
) -> None:
    """Over random node outages and whole-bus gaps: a node declared lost was silent for at
    least a window while the bus carried the others; a node never silent is never lost;
    lost and recovered alternate."""
    fleet = Fleet(6)
    down = {(n, round(s * 4) / 4, round((s + d) * 4) / 4) for n, s, d in outages}
    gaps = [(round(s * 4) / 4, round((s + d) * 4) / 4) for s, d in bus_gaps]
    silent_nodes = {f"n{n}" for n, _, _ in down}
    while fleet.now < 60:
        t = fleet.now + 0.25
        fleet.up = {
            name
            for name in fleet.names
            if not any(name == f"n{n}" and s <= t < e for n, s, e in down)
        }
        fleet.run(0.25, hear=not any(s <= t < e for s, e in gaps))
    for name in fleet.names:
        kinds = [k for k in fleet.kinds(name) if k in ("lost", "recovered")]
        assert kinds == ["lost", "recovered"] * (len(kinds) // 2) + ["lost"] * (len(kinds) % 2)
        if name not in silent_nodes:
            assert kinds == [], (name, fleet.verdicts)


def test_after_a_reconnect_a_node_late_to_the_bus_is_waited_for_the_reconnect_grace() -> None:
    """A NATS restart: the detector is back at once, one node's agent only 10 s later (it
    waited for the auth callout). Within the reconnect grace that node is not lost; without
    the grace (one window) it is, and a node silent past the grace still is."""
    for grace, lost in ((15.0, []), (0.0, ["n0"])):
        fleet = Fleet(8, rules=msgspec.structs.replace(RULES, reconnect_grace=grace))
        fleet.run(5)
        fleet.detector.resume(now=fleet.now, reconnected=True)
        fleet.up.discard("n0")
        fleet.run(10)
        fleet.up.add("n0")
        fleet.run(10)
        assert [node for _, kind, node in fleet.verdicts if kind == "lost"] == lost, grace
    fleet = Fleet(8, rules=msgspec.structs.replace(RULES, reconnect_grace=15.0))
    fleet.run(5)
    fleet.detector.resume(now=fleet.now, reconnected=True)
    fleet.up.discard("n0")
    fleet.run(25)
    assert [node for _, kind, node in fleet.verdicts if kind == "lost"] == ["n0"]
