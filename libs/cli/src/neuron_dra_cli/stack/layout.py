"""Where things live under a stack's state directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig users export as KUBECONFIG."""
        return self.root / "kubeconfig"

    def component_kubeconfig(self, name: str) -> Path:
        return self.root / "kubeconfigs" / f"{name}.yaml"

    def node_dir(self, node: str) -> Path:
        return self.root / "nodes" / node

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"
