"""Pool writes: generation bumped on change, slice count right, owner, nothing when unchanged."""

from __future__ import annotations

from typing import Any

from neuron_dra_slice_publisher.pool import (
    NodeRef,
    Plan,
    StoredSlice,
    plan_pool,
    slice_name,
    slice_summary,
    stored_slice,
)
from neuron_dra_slice_publisher.slices import NodeDeviceMode, PoolContent, build_pool

from tests.unit.slices.support import US_LABELS, hardware

OWNER = NodeRef(name="node-a", uid="uid-1")


def content(instance_type: str = "trn2u.48xlarge", *, driver: str = "2.24.7.0") -> PoolContent:
    kw: dict[str, Any] = {"ultraserver_node": 0} if instance_type.startswith("trn2u") else {}
    return build_pool(
        node="node-a",
        hardware=hardware(instance_type, driver=driver, **kw),
        labels=US_LABELS,
        mode=NodeDeviceMode.COUNTERS,
        dra_driver_version="0.1.0",
    )


def apply(plan: Plan, stored: list[StoredSlice]) -> list[StoredSlice]:
    """What the API would hold after the plan (resource versions as counters)."""
    by_name = {s.name: s for s in stored}
    for w in plan.writes:
        by_name[w.name] = stored_slice(
            {**w.body, "metadata": {**w.body["metadata"], "resourceVersion": "rv"}}
        )
    for name in plan.deletes:
        del by_name[name]
    return list(by_name.values())


def test_first_write_is_generation_one_with_every_slice_counted() -> None:
    plan = plan_pool(content(), owner=OWNER, stored=[])
    assert plan.generation == 1
    assert [w.name for w in plan.writes] == [slice_name("node-a", 0), slice_name("node-a", 1)]
    for w in plan.writes:
        spec = w.body["spec"]
        assert spec["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 2}
        assert spec["nodeName"] == "node-a"
        assert spec["driver"] == "neuron.aws.com"
        assert w.body["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-1"}
        ]
        assert w.resource_version == ""
    assert "sharedCounters" in plan.writes[0].body["spec"]
    assert "devices" not in plan.writes[0].body["spec"]


def test_nothing_is_written_when_nothing_changed() -> None:
    stored = apply(plan_pool(content(), owner=OWNER, stored=[]), [])
    again = plan_pool(content(), owner=OWNER, stored=stored)
    assert again.unchanged
    assert again.generation == 1


def test_a_change_rewrites_the_pool_under_the_next_generation() -> None:
    stored = apply(plan_pool(content(), owner=OWNER, stored=[]), [])
    plan = plan_pool(content(driver="2.26.0.0"), owner=OWNER, stored=stored)
    assert plan.generation == 2
    assert len(plan.writes) == 2
    assert all(w.resource_version == "rv" for w in plan.writes)
    assert {w.body["spec"]["pool"]["generation"] for w in plan.writes} == {2}


def test_fewer_slices_deletes_the_extra_ones_after_writing() -> None:
    stored = apply(plan_pool(content(), owner=OWNER, stored=[]), [])
    plan = plan_pool(content("trn2.48xlarge"), owner=OWNER, stored=stored)
    assert [w.name for w in plan.writes] == [slice_name("node-a", 0)]
    assert plan.writes[0].body["spec"]["pool"]["resourceSliceCount"] == 1
    assert plan.deletes == (slice_name("node-a", 1),)


def test_a_recreated_node_gets_its_slices_rewritten_with_the_new_owner() -> None:
    stored = apply(plan_pool(content(), owner=OWNER, stored=[]), [])
    plan = plan_pool(content(), owner=NodeRef(name="node-a", uid="uid-2"), stored=stored)
    assert not plan.unchanged
    assert plan.writes[0].body["metadata"]["ownerReferences"][0]["uid"] == "uid-2"


def test_mixed_generations_are_repaired() -> None:
    stored = apply(plan_pool(content(), owner=OWNER, stored=[]), [])
    stored[0] = StoredSlice(
        **{**{f: getattr(stored[0], f) for f in stored[0].__struct_fields__}, "generation": 7}
    )
    plan = plan_pool(content(), owner=OWNER, stored=stored)
    assert plan.generation == 8


def test_no_content_deletes_the_pool() -> None:
    stored = apply(plan_pool(content(), owner=OWNER, stored=[]), [])
    plan = plan_pool(None, owner=OWNER, stored=stored)
    assert plan.writes == ()
    assert set(plan.deletes) == {s.name for s in stored}


def test_long_node_names_still_make_valid_slice_names() -> None:
    node = "ip-10-0-0-1." + "a" * 240 + ".internal"
    name = slice_name(node, 3)
    assert len(name) <= 253
    assert name.endswith("-neuron.aws.com-3")
    assert name != slice_name(node[:-1] + "x", 3)


def test_the_informer_summary_keeps_everything_the_plan_reads() -> None:
    plan = plan_pool(content(), owner=OWNER, stored=[])
    for w in plan.writes:
        obj = {
            **w.body,
            "metadata": {**w.body["metadata"], "resourceVersion": "7", "managedFields": [{}]},
        }
        summary = slice_summary(obj)
        assert stored_slice(summary) == stored_slice(obj)
        assert "devices" not in summary["spec"]
        assert "sharedCounters" not in summary["spec"]
        assert "managedFields" not in summary["metadata"]


def test_metadata_alone_says_everything_the_plan_reads() -> None:
    plan = plan_pool(content(), owner=OWNER, stored=[])
    assert len(plan.writes) > 1
    for w in plan.writes:
        full = {**w.body, "metadata": {**w.body["metadata"], "resourceVersion": "7"}}
        # What a metadata-only list or watch returns for the slice.
        partial = {
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": full["metadata"],
        }
        assert stored_slice(slice_summary(partial)) == stored_slice(full)


def test_a_slice_whose_pool_annotation_was_edited_is_written_again() -> None:
    plan = plan_pool(content(), owner=OWNER, stored=[])
    stored = []
    for w in plan.writes:
        meta = {**w.body["metadata"], "resourceVersion": "7"}
        meta["annotations"] = {**meta["annotations"], "neuron.aws.com/pool": "edited"}
        stored.append(stored_slice({"metadata": meta}))
    again = plan_pool(content(), owner=OWNER, stored=stored)
    assert not again.unchanged
    assert {w.body["spec"]["pool"]["generation"] for w in again.writes} == {1}
