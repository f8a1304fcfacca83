"""The probe's book of faults: one event per change, the worst fault first, repairs by
source, and the Node conditions."""

from __future__ import annotations

from datetime import UTC, datetime

from neuron_dra_common.events import DeviceHealthChanged
from neuron_dra_health_monitor.probestate import Fault, HealthBook, node_conditions

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def test_first_fault_makes_the_device_unhealthy_and_a_repeat_is_silent() -> None:
    book = HealthBook(node="n1")
    event = book.add(
        "neurondevice3",
        Fault(error_type="NC_UNCORRECTABLE_ERROR", source="kernel", evidence="line", core=2),
        now=NOW,
    )
    assert event is not None
    assert (event.health, event.previous, event.severity, event.action, event.core) == (
        "Unhealthy",
        "Healthy",
        "uncorrectable",
        "replace-instance",
        2,
    )
    assert event.reason == "NC_UNCORRECTABLE_ERROR on neurondevice3 core 2: replace-instance"
    again = Fault(error_type="NC_UNCORRECTABLE_ERROR", source="counter")
    assert book.add("neurondevice3", again, now=NOW) is None


def test_the_worst_fault_describes_the_device() -> None:
    book = HealthBook(node="n1")
    book.add("neurondevice1", Fault(error_type="NEURONLINK_DOWN", source="link"), now=NOW)
    event = book.add("neurondevice1", Fault(error_type="DMA_ERROR", source="kernel"), now=NOW)
    assert event is not None
    assert (event.error_type, event.previous) == ("DMA_ERROR", "Unhealthy")
    assert "also NEURONLINK_DOWN" in event.reason
    # The link comes back: still unhealthy with the DMA error.
    event = book.clear(
        "neurondevice1", sources=("link",), error_type="NEURONLINK_DOWN", why="up", now=NOW
    )
    assert event is not None
    assert (event.health, event.error_type) == ("Unhealthy", "DMA_ERROR")
    # A link repair does not clear a hardware error; a driver reload does.
    assert book.clear("neurondevice1", sources=("link",), why="up", now=NOW) is None
    event = book.clear("neurondevice1", sources=("kernel", "counter", "bus"), why="reload", now=NOW)
    assert event is not None
    assert (event.health, event.previous, event.severity, event.reason) == (
        "Healthy",
        "Unhealthy",
        "",
        "reload",
    )


def test_seeded_from_the_bus_after_a_restart() -> None:
    book = HealthBook(node="n1")
    book.seed(
        DeviceHealthChanged(
            node="n1",
            device="neurondevice4",
            health="Unhealthy",
            error_type="HBM_UNCORRECTABLE_ERROR",
            severity="uncorrectable",
        )
    )
    book.seed(DeviceHealthChanged(node="other", device="neurondevice5", health="Unhealthy"))
    assert book.devices() == ("neurondevice4",)
    assert (
        book.add(
            "neurondevice4", Fault(error_type="HBM_UNCORRECTABLE_ERROR", source="counter"), now=NOW
        )
        is None
    )
    book.seed(DeviceHealthChanged(node="n1", device="neurondevice4", health="Healthy"))
    assert book.devices() == ()


def test_node_conditions() -> None:
    healthy = node_conditions({})
    assert healthy["NeuronHealth"][:2] == ("False", "NeuronHasNoError")
    assert healthy["AcceleratedHardwareReady"][:2] == ("True", "NeuronHasNoError")
    link = Fault(error_type="NEURONLINK_DOWN", source="link")
    degraded = node_conditions({"neurondevice0": (link,)})
    assert degraded["NeuronHealth"][:2] == ("True", "NeuronHasError_NEURONLINK_DOWN")
    # A link down alone asks no repair of the node.
    assert degraded["AcceleratedHardwareReady"][0] == "True"
    sram = Fault(error_type="SRAM_UNCORRECTABLE_ERROR", source="kernel")
    hbm = Fault(error_type="HBM_REPAIRABLE_ERROR", source="counter")
    bad = node_conditions({"neurondevice0": (link,), "neurondevice7": (hbm, sram)})
    assert bad["NeuronHealth"][:2] == ("True", "NeuronHasError_SRAM_UNCORRECTABLE_ERROR")
    assert bad["AcceleratedHardwareReady"][:2] == (
        "False",
        "NeuronHasError_SRAM_UNCORRECTABLE_ERROR",
    )
    assert "neurondevice7: SRAM_UNCORRECTABLE_ERROR" in bad["NeuronHealth"][2]
