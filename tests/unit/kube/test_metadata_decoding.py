"""Metadata-only answers are decoded without the objects' field managers."""

from __future__ import annotations

import msgspec
from neuron_dra_common.kube.client import (
    _decode_metadata,
    _decode_metadata_event,
    _decode_metadata_list,
)

MANAGED = [
    {
        "manager": "writer",
        "operation": "Update",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {"f:devices": {'k:{"name":"d0"}': {".": {}, "f:name": {}}}}},
    }
]
META = {
    "name": "s1",
    "uid": "u-1",
    "resourceVersion": "42",
    "generation": 3,
    "creationTimestamp": "2026-01-01T00:00:00Z",
    "labels": {"a": "b"},
    "annotations": {"neuron.aws.com/pool": "3/1"},
    "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "n-1"}],
    "managedFields": MANAGED,
}
PARTIAL = {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": META}
WITHOUT = {**PARTIAL, "metadata": {k: v for k, v in META.items() if k != "managedFields"}}


def test_an_object_keeps_everything_but_its_field_managers() -> None:
    assert _decode_metadata(msgspec.json.encode(PARTIAL)) == WITHOUT


def test_a_list_keeps_its_metadata_and_items() -> None:
    page = {
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadataList",
        "metadata": {"resourceVersion": "50", "continue": "abc"},
        "items": [PARTIAL, PARTIAL],
    }
    decoded = _decode_metadata_list(msgspec.json.encode(page))
    assert decoded == {**page, "items": [WITHOUT, WITHOUT]}


def test_an_empty_list_has_null_items() -> None:
    page = b'{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1",'
    page += b'"metadata":{"resourceVersion":"12370"},"items":null}\n'
    decoded = _decode_metadata_list(page)
    assert decoded["items"] is None
    assert decoded["metadata"] == {"resourceVersion": "12370"}


def test_watch_events_bookmarks_and_errors() -> None:
    line = msgspec.json.encode({"type": "MODIFIED", "object": PARTIAL}) + b"\n"
    assert _decode_metadata_event(line) == {"type": "MODIFIED", "object": WITHOUT}
    bookmark = {
        "type": "BOOKMARK",
        "object": {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {
                "resourceVersion": "77",
                "annotations": {"k8s.io/initial-events-end": "true"},
            },
        },
    }
    assert _decode_metadata_event(msgspec.json.encode(bookmark)) == bookmark
    error = {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": "too old resource version",
            "reason": "Expired",
            "code": 410,
        },
    }
    assert _decode_metadata_event(msgspec.json.encode(error)) == error
