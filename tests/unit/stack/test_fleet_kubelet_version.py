"""A fleet group's ``kubeletVersion``: a node on a kubelet release of its own (one kubebuild
builds a simulated node of), refused naming the line and the field otherwise."""

from __future__ import annotations

import pytest
from neuron_dra_cli.stack.fleet import FleetError, parse_fleet

FLEET = """\
region: us-west-2
nodes:
  - instanceType: trn2.48xlarge
    namePrefix: old-kubelet-
    kubeletVersion: {version}
  - instanceType: trn2.48xlarge
"""


@pytest.mark.parametrize("version", ['"1.34.1"', "v1.34.1", '"1.34.4"'])
def test_a_group_runs_the_kubelet_release_it_names(version: str) -> None:
    old, other = parse_fleet(FLEET.format(version=version)).nodes
    assert old.name == "old-kubelet-0"
    assert old.kubelet_version == version.strip('"').removeprefix("v")
    assert other.kubelet_version == ""  # the stack's own release


def test_a_release_without_a_simulated_node_is_refused_naming_the_field() -> None:
    with pytest.raises(FleetError) as info:
        parse_fleet(FLEET.format(version='"1.34.0"'), source="fleet.yaml")
    message = str(info.value)
    assert message.startswith("fleet.yaml:5: nodes[0].kubeletVersion: ")
    assert "no simulated node of kubelet '1.34.0'" in message
    assert "1.34.1" in message
