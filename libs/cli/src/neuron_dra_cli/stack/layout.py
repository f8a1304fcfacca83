"""Where things live under a stack's state directory."""

from __future__ import annotations

import hashlib
import os
import tempfile
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

    @property
    def short_nodes(self) -> Path:
        """A short alias (a symlink in the temp dir) of ``<root>/nodes``.

        Unix socket paths are limited to 107 bytes, and the kubelet and DRA plugins bind
        sockets several levels below a node's kubelet root. Reaching the node folders
        through this alias keeps those paths short wherever the state directory is.
        """
        digest = hashlib.sha256(str(self.root).encode()).hexdigest()[:10]
        return Path(tempfile.gettempdir()) / f"ndra-{digest}"

    def ensure_short_nodes(self) -> Path:
        alias, target = self.short_nodes, self.root / "nodes"
        target.mkdir(parents=True, exist_ok=True)
        if alias.is_symlink() and Path(os.readlink(alias)) == target:
            return alias
        alias.unlink(missing_ok=True)
        alias.symlink_to(target, target_is_directory=True)
        return alias

    @property
    def zygote_socket(self) -> Path:
        """The agent zygote's control socket (``stack.zygote``), in the state directory
        through the short alias (socket paths are limited to 107 bytes)."""
        return self.short_nodes / ".agent-zygote.sock"

    def kubelet_root(self, node: str) -> Path:
        """The node's kubelet root as the kubelet and plugins see it (through the alias)."""
        return self.short_nodes / node / "kubelet"

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"
