"""Entry point: ``neuron-dra-device-plugin`` / ``python -m neuron_dra_device_plugin``.

Only the settings are read before the wiring is imported: ``--help`` and a bad setting
answer at once, without loading gRPC or the Kubernetes client.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]

PROG = "neuron-dra-device-plugin"


def main(argv: Sequence[str] | None = None) -> int:
    from neuron_dra_common.settings import SettingsError, load

    from neuron_dra_device_plugin.settings import DevicePluginSettings

    try:
        settings = load(
            DevicePluginSettings, argv=sys.argv[1:] if argv is None else argv, prog=PROG
        )
    except (SettingsError, ValueError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2

    from neuron_dra_common.runtime.process import Service, run
    from neuron_dra_common.topology import UnknownInstanceType

    from neuron_dra_device_plugin.wiring import NAME, build, inventory_of

    try:
        inventory = inventory_of(settings)
    except (UnknownInstanceType, ValueError) as exc:
        print(f"{PROG}: node {settings.node_name}: {exc}", file=sys.stderr)
        return 1

    async def wire() -> Service:
        return await build(settings, inventory=inventory)

    return run(wire, name=NAME, settings=settings)
