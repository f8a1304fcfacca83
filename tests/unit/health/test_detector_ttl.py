"""The failure detector's rule for ttl-mode nodes over simulated time: the bus keeps each
node's last beat for its TTL and answers, once a second, which it still holds."""

from __future__ import annotations

from neuron_dra_health_monitor.detector import Detector, DetectorRules

RULES = DetectorRules(misses=3, min_window=2.0, recover_beats=3, restart_grace=10.0)
TTL = 3.0


class Bus:
    """Nodes beating every second, their beats kept ``TTL`` s; a poll every second."""

    def __init__(self, nodes: int, *, rules: DetectorRules = RULES, ttl: float = TTL) -> None:
        self.names = [f"n{i}" for i in range(nodes)]
        self.detector = Detector(rules)
        self.ttl = ttl
        self.up = set(self.names)
        self.beat_at = dict.fromkeys(self.names, 0.0)
        self.seq = 0
        self.now = 0.0
        self.answering = True
        self.verdicts: list[tuple[float, str, str]] = []
        self.detector.resume(now=0.0)
        for name in self.names:  # the hellos
            self.detector.heard(name, now=0.0, interval=1.0, sequence=0, boot_id="b", ttl=ttl)

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.now = round(self.now + 0.25, 2)
            if self.now == int(self.now):
                self.seq += 1
                for name in self.up:
                    self.beat_at[name] = self.now
                if self.answering:
                    held = {n for n, at in self.beat_at.items() if self.now - at < self.ttl}
                    self.detector.answer(held, now=self.now)
            for v in self.detector.judge(now=self.now):
                self.verdicts.append((self.now, v.kind, v.node))

    def kinds(self) -> list[tuple[str, str]]:
        return [(kind, node) for _, kind, node in self.verdicts]


def test_a_node_whose_beat_the_bus_dropped_is_lost_at_the_first_answer_without_it() -> None:
    bus = Bus(5)
    bus.run(10)
    assert bus.verdicts == []
    bus.up.discard("n4")
    silent = bus.now
    bus.run(6)
    [(at, kind, node)] = bus.verdicts
    assert (kind, node) == ("lost", "n4")
    # Its last beat drops TTL s after it was sent; the next answer shows it.
    assert at == silent + TTL


def test_a_longer_window_of_the_detector_still_rules() -> None:
    bus = Bus(5, rules=DetectorRules(misses=6, min_window=2.0))
    bus.run(10)
    bus.up.discard("n4")
    silent = bus.now
    bus.run(10)
    [(at, kind, _)] = bus.verdicts
    assert kind == "lost"
    assert at == silent + 6.0


def test_most_of_the_fleet_absent_at_once_blames_the_bus() -> None:
    """After a failover the new leader holds few beats: nobody is declared, and once the
    fleet is back in the answers a really silent node is found."""
    bus = Bus(10)
    bus.run(10)
    held = dict(bus.beat_at)
    bus.beat_at = dict.fromkeys(bus.names, -100.0)  # every beat dropped at once
    bus.up.clear()
    bus.run(3)
    assert bus.verdicts == []
    bus.beat_at = held
    bus.up = set(bus.names) - {"n9"}
    bus.run(10)
    assert bus.kinds() == [("lost", "n9")]


def test_a_node_within_its_restart_grace_is_not_judged() -> None:
    bus = Bus(5)
    bus.run(5)
    bus.up.discard("n0")
    bus.detector.heard(
        "n0", now=bus.now, interval=1.0, sequence=99, boot_id="b", stopping=True, ttl=TTL
    )
    bus.run(8)
    assert bus.kinds() == [("restarting", "n0")]
    bus.run(8)
    assert bus.kinds() == [("restarting", "n0"), ("lost", "n0")]


def test_a_lost_node_recovers_after_three_beats_read_back_not_one_answer() -> None:
    bus = Bus(5)
    bus.run(5)
    bus.up.discard("n0")
    bus.run(5)
    assert bus.kinds() == [("lost", "n0")]
    bus.up.add("n0")
    bus.run(3)  # present in the answers, but no beat read back: still lost
    assert bus.detector.lost() == ["n0"]
    for seq in (1, 2, 3):
        bus.detector.heard("n0", now=bus.now, interval=1.0, sequence=seq, boot_id="b2")
        bus.run(1)
    assert bus.kinds() == [("lost", "n0"), ("recovered", "n0")]


def test_a_stream_mode_node_is_not_judged_by_the_answers() -> None:
    bus = Bus(4)
    bus.detector.heard("old", now=0.0, interval=1.0, sequence=1, boot_id="b")
    bus.run(2)
    # "old" is in no answer (it does not beat there) and keeps sending NodeHeartbeats.
    for seq in range(2, 8):
        bus.detector.heard("old", now=bus.now, interval=1.0, sequence=seq, boot_id="b")
        bus.run(1)
    assert bus.verdicts == []
    bus.run(4)
    assert bus.kinds() == [("lost", "old")]
