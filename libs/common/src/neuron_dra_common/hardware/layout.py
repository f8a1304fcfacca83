"""Where the Neuron driver puts things on a node, relative to a root directory.

On a real node the root is ``/``; tests and the local stack use a directory of their own. The
reader and the simulator both build their paths here, so they cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "ECC_COUNTERS",
    "MAX_DEVICES",
    "NodePaths",
]

#: The driver creates at most this many ``/dev/neuronN`` nodes.
MAX_DEVICES = 64

#: ECC counter directories under ``stats/hardware``, by :class:`EccCounters` field name.
ECC_COUNTERS: dict[str, str] = {
    "sram_uncorrected": "sram_ecc_uncorrected",
    "mem_uncorrected": "mem_ecc_uncorrected",
    "mem_repairable_uncorrected": "mem_ecc_repairable_uncorrected",
}


class NodePaths:
    """Absolute paths of the driver's files under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dev = root / "dev"
        self.neuron_class = root / "sys" / "class" / "neuron_device"
        self.driver_version = root / "sys" / "module" / "neuron" / "version"
        self.product_name = root / "sys" / "class" / "dmi" / "id" / "product_name"
        self.lnc_config = root / "opt" / "aws" / "neuron" / "logical_nc_config"
        self.neuron_ls = root / "opt" / "aws" / "neuron" / "bin" / "neuron-ls"
        self.neuron_ls_json = root / "opt" / "aws" / "neuron" / "neuron-ls.json"
        #: A simulated node's kernel log (a real node's is ``/dev/kmsg``).
        self.kernel_log = root / "var" / "log" / "kern.log"

    def dev_node(self, index: int) -> Path:
        """``/dev/neuronN``."""
        return self.dev / f"neuron{index}"

    def device(self, index: int) -> Path:
        """The device's sysfs directory."""
        return self.neuron_class / f"neuron{index}"

    def class_file(self, name: str) -> Path:
        """A class-level file (UltraServer ids and modes)."""
        return self.neuron_class / name

    def core(self, index: int, core: int) -> Path:
        """A physical NeuronCore's sysfs directory."""
        return self.device(index) / f"neuron_core{core}"
