"""The inputs of one explanation: raw API objects as decoded from the API's JSON."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

__all__ = ["Snapshot"]

Obj = dict[str, Any]


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """Everything explain reads, as plain dicts (``metadata``, ``spec``, ``status``);
    ``server_version`` (``v1.36.3``) turns off what older schedulers do not check."""

    pods: list[Obj] = []
    nodes: list[Obj] = []
    slices: list[Obj] = []
    claims: list[Obj] = []
    classes: list[Obj] = []
    templates: list[Obj] = []
    workloads: list[Obj] = []
    ultraservers: list[Obj] = []
    server_version: str = ""
    resource_versions: dict[str, str] = {}

    def __repr__(self) -> str:
        # Counts only: at 1,000 nodes the full repr is some 30 MB of text, and Python 3.11's
        # asyncio.run formats the repr of its main task, result included, when it ends.
        counts = ", ".join(
            f"{name}={len(getattr(self, name))}"
            for name in ("pods", "nodes", "slices", "claims", "classes", "templates")
        )
        return f"Snapshot({counts}, server_version={self.server_version!r})"

    @classmethod
    def build(
        cls,
        *,
        pods: Sequence[Obj] = (),
        nodes: Sequence[Obj] = (),
        slices: Sequence[Obj] = (),
        claims: Sequence[Obj] = (),
        classes: Sequence[Obj] = (),
        templates: Sequence[Obj] = (),
        workloads: Sequence[Obj] = (),
        ultraservers: Sequence[Obj] = (),
        server_version: str = "",
        resource_versions: Mapping[str, str] | None = None,
    ) -> Snapshot:
        return cls(
            pods=list(pods),
            nodes=list(nodes),
            slices=list(slices),
            claims=list(claims),
            classes=list(classes),
            templates=list(templates),
            workloads=list(workloads),
            ultraservers=list(ultraservers),
            server_version=server_version,
            resource_versions=dict(resource_versions or {}),
        )
