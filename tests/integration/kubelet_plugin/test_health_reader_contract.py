"""The reader contract run against the kubelet plugin's health feed: a malformed health
message on this node's subjects is a dead letter with its reason (it used to be logged and
skipped), once, and the feed goes on reporting the node's devices to the kubelet."""

from __future__ import annotations

from neuron_dra_common.bus import Bus, Follower
from neuron_dra_common.events import DeviceHealthChanged, Event
from neuron_dra_kubelet_plugin.bushealth import READER, BusHealth
from neuron_dra_kubelet_plugin.health import Health

from tests.contracts.reader import ReaderContract

NODE = "ip-10-0-0-9.ec2.internal"


class TestPluginHealthFeed(ReaderContract):
    health: BusHealth
    fuzz_good = (1, 2, 3)  # the devices the feed reports

    def sample_event(self, index: int) -> Event:
        return DeviceHealthChanged(node=NODE, device=f"neurondevice{index}", health="Unhealthy")

    def make_reader(self, bus: Bus) -> Follower:
        self.health = BusHealth(
            node=NODE, pool=NODE, devices=[f"neurondevice{i}" for i in (1, 2, 3)]
        )
        reader = self.health.follower(bus)
        assert reader.name == READER
        return reader

    async def effect_count(self, event: Event) -> int:
        assert isinstance(event, DeviceHealthChanged)
        states = {r.device: r.health for r in self.health.snapshot()}
        return int(states.get(event.device) is Health.UNHEALTHY)
