"""Properties that hold for every instance type of the catalog."""

from hypothesis import given
from hypothesis import strategies as st
from neuron_dra_common.topology import (
    CATALOG,
    InstanceSpec,
    LinkTopology,
    adjacency,
    attribute_groups,
    connected_sets,
    group_attribute_names,
    is_connected_set,
    is_linked_graph,
    node_attributes,
)

specs = st.sampled_from(CATALOG)


@given(specs)
def test_every_published_group_is_a_connected_set(spec: InstanceSpec) -> None:
    for attribute in group_attribute_names(spec):
        for members in attribute_groups(spec, attribute).values():
            assert is_connected_set(spec, members), (spec.name, attribute, members)
            # And physically linked, checked against the link graph rather than the rules.
            assert is_linked_graph(spec, members), (spec.name, attribute, members)


@given(specs)
def test_groups_of_one_attribute_partition_the_node(spec: InstanceSpec) -> None:
    for attribute in group_attribute_names(spec):
        groups = list(attribute_groups(spec, attribute).values())
        covered = [d for members in groups for d in members]
        # Each device in exactly one group: no duplicates and nothing left out.
        assert sorted(covered) == list(range(spec.devices)), (spec.name, attribute)


@given(specs)
def test_group_values_are_distinct_per_group(spec: InstanceSpec) -> None:
    for attribute in group_attribute_names(spec):
        groups = attribute_groups(spec, attribute)
        seen: set[int] = set()
        for members in groups.values():
            assert seen.isdisjoint(members)
            seen.update(members)


@given(specs)
def test_adjacency_is_symmetric(spec: InstanceSpec) -> None:
    table = adjacency(spec)
    for device, linked in enumerate(table):
        assert device not in linked
        assert len(set(linked)) == len(linked)
        for other in linked:
            assert device in table[other], (spec.name, device, other)


@given(specs, st.data())
def test_every_connected_set_is_linked(spec: InstanceSpec, data: st.DataObject) -> None:
    count = data.draw(st.integers(min_value=1, max_value=spec.devices))
    sets = connected_sets(spec, count)
    if spec.topology is LinkTopology.ALL_TO_ALL:
        return  # every subset; enumerated, not worth walking
    for members in sets:
        assert len(members) == count
        assert is_linked_graph(spec, members)


@given(st.integers(min_value=1, max_value=12), st.integers(min_value=0, max_value=11))
def test_ring_windows_are_contiguous_modulo_n(count: int, start: int) -> None:
    window = [(start + k) % 12 for k in range(count)]
    assert is_connected_set("inf2.48xlarge", window)


def _size_of(attribute: str) -> int:
    digits = "".join(ch for ch in attribute.rsplit("/", 1)[-1] if ch.isdigit())
    return int(digits)


@given(specs)
def test_attributes_of_one_size_agree_on_the_groups(spec: InstanceSpec) -> None:
    # topology4_id and devicegroup4_id must cut the node the same way, or a claim matching
    # one would straddle the other's groups.
    partitions: dict[int, set[frozenset[int]]] = {}
    for attribute in group_attribute_names(spec):
        cut = {frozenset(m) for m in attribute_groups(spec, attribute).values()}
        assert partitions.setdefault(_size_of(attribute), cut) == cut, (spec.name, attribute)


@given(specs)
def test_attributes_fit_the_dra_limits(spec: InstanceSpec) -> None:
    for attrs in node_attributes(spec):
        assert len(attrs) <= 32
        for name, value in attrs.items():
            identifier = name.rsplit("/", 1)[-1]
            assert identifier.isidentifier()
            assert len(identifier) <= 32
            if isinstance(value, str):
                assert len(value) <= 64
