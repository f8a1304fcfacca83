"""Counter deltas, resets and links, from the simulated hardware as the reader sees it."""

from __future__ import annotations

from pathlib import Path

from neuron_dra_common.hardware.simulate import inject_fault, write_counter, write_node
from neuron_dra_common.hardware.sysfs import read_sysfs
from neuron_dra_common.topology import instance_spec
from neuron_dra_common.topology.adjacency import adjacency
from neuron_dra_health_monitor.counters import (
    compare_totals,
    counter_totals,
    lost_modes,
    missing_links,
)


def _node(tmp_path: Path) -> Path:
    write_node(tmp_path, instance_type="trn2.48xlarge", node_name="n1")
    return tmp_path


def test_only_increases_are_news_and_old_totals_are_a_baseline(tmp_path: Path) -> None:
    root = _node(tmp_path)
    # A node that already had errors before the probe started: its totals are the baseline.
    write_counter(root, device=2, counter="sram_ecc_uncorrected", total=5, present=0)
    before = counter_totals(read_sysfs(root).devices)
    assert compare_totals(before, before) == ([], set())
    inject_fault(root, fault="sram", node_name="n1", device=2)
    inject_fault(root, fault="nc", node_name="n1", device=4, core=6)
    increases, reset = compare_totals(before, counter_totals(read_sysfs(root).devices))
    assert reset == set()
    assert [(i.device, i.core, i.error_type, i.before, i.after) for i in increases] == [
        (2, None, "SRAM_UNCORRECTABLE_ERROR", 5, 6),
        (4, 6, "NC_UNCORRECTABLE_ERROR", 0, 1),
    ]
    assert increases[1].evidence == "neuron4/neuron_core6 hw_error total 0 -> 1"


def test_a_counter_that_goes_down_is_a_driver_reload(tmp_path: Path) -> None:
    root = _node(tmp_path)
    inject_fault(root, fault="hbm-repairable", node_name="n1", device=1)
    before = counter_totals(read_sysfs(root).devices)
    inject_fault(root, fault="repair", node_name="n1", device=1)
    inject_fault(root, fault="hbm-repairable", node_name="n1", device=1)  # 1 -> 0 -> 1
    increases, reset = compare_totals(before, counter_totals(read_sysfs(root).devices))
    assert increases == []  # same total, but a new life: nothing to report as new
    before = counter_totals(read_sysfs(root).devices)
    inject_fault(root, fault="repair", node_name="n1", device=1)
    increases, reset = compare_totals(before, counter_totals(read_sysfs(root).devices))
    assert (increases, reset) == ([], {1})


def test_a_counter_seen_the_first_time_is_no_increase() -> None:
    assert compare_totals({}, {"0/mem_ecc_uncorrected": 3}) == ([], set())


def test_link_down_and_back(tmp_path: Path) -> None:
    root = _node(tmp_path)
    expected = adjacency(instance_spec("trn2.48xlarge"))
    assert missing_links(expected, read_sysfs(root).devices) == {}
    inject_fault(root, fault="link-down", node_name="n1", device=0)
    # Device 0's first neighbour in the torus is 12 (up); both ends lose the link.
    assert missing_links(expected, read_sysfs(root).devices) == {0: (12,), 12: (0,)}
    inject_fault(root, fault="repair", node_name="n1")
    assert missing_links(expected, read_sysfs(root).devices) == {}


def test_lost_ultraserver_modes() -> None:
    assert lost_modes((1, 2, 3, 4), (1, 2, 3, 4)) == ()
    assert lost_modes((1, 2, 3, 4), (4,)) == (1, 2, 3)
