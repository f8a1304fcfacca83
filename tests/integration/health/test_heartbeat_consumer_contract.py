"""The shared consumer contract run against the failure detector's heartbeat handler
(``health-monitor-heartbeats``): a heartbeat is heard once, whatever the redeliveries, and a
malformed one is a dead letter with its reason."""

from __future__ import annotations

from neuron_dra_common.bus import Bus, Handler, consumer
from neuron_dra_common.events import Event, NodeHeartbeat
from neuron_dra_health_monitor.detector import Detector
from neuron_dra_health_monitor.detector_service import DURABLE, FailureDetector

from tests.contracts.consumer import ConsumerContract
from tests.contracts.support import heartbeat


class TestFailureDetectorHeartbeats(ConsumerContract):
    spec = consumer(DURABLE)
    detector: Detector

    def sample_event(self, index: int) -> Event:
        return heartbeat(f"contract-node-{index}", sequence=index + 1)

    async def make_handler(self, bus: Bus) -> Handler:
        self.detector = Detector()
        service = FailureDetector(bus=bus, detector=self.detector, notes=None, source="/test")
        return service.handle

    async def effect_count(self, event: Event) -> int:
        assert isinstance(event, NodeHeartbeat)
        state = self.detector.nodes.get(event.node)
        return int(state is not None and state.sequence == event.sequence)
