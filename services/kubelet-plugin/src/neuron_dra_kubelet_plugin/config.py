"""Opaque device configuration of ``neuron.aws.com``: strict decoding and precedence.

Two kinds, each under every API spelling AWS's examples use::

    apiVersion: neuron.aws.com/v1            (also neuron.aws.com/v1alphav1,
    kind: NeuronConfig                        resource.neuron.aws.com/v1alphav1)
    logicalNeuronCore: 1 | 2

    kind: UltraServerConfig
    ultraserverMode: 1 | 2 | 4                (a node count, not the driver's mode enum)

Precedence: configs from the DeviceClass come before those from the claim, and among the
configs that apply to a request the later one of a kind replaces the earlier one whole.
Anything unexpected (unknown kind, unknown field, wrong type, value out of range) is an
error naming the field, e.g. ``config[0].opaque.parameters.logicalNeuronCore: 3 is not one
of 1, 2``; the claim then fails with that message and nothing else on the node changes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import msgspec
from neuron_dra_common.driver import DRIVER_NAME

from neuron_dra_kubelet_plugin.claims import AllocationConfig, parent_request

__all__ = [
    "API_VERSIONS",
    "KINDS",
    "LOGICAL_NEURON_CORE_VALUES",
    "ULTRASERVER_MODE_VALUES",
    "ConfigError",
    "DecodedConfig",
    "EffectiveConfig",
    "NeuronConfig",
    "UltraServerConfig",
    "decode_configs",
    "decode_parameters",
    "effective_config",
]

API_VERSIONS: tuple[str, ...] = (
    "neuron.aws.com/v1",
    "neuron.aws.com/v1alphav1",
    "resource.neuron.aws.com/v1alphav1",
)
LOGICAL_NEURON_CORE_VALUES: tuple[int, ...] = (1, 2)
ULTRASERVER_MODE_VALUES: tuple[int, ...] = (1, 2, 4)


class ConfigError(ValueError):
    """An opaque config is not valid; the message starts with the path of the bad field."""


class NeuronConfig(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"
):
    """Per-request Neuron settings; ``None`` leaves the node's default in force."""

    api_version: str
    kind: str
    logical_neuron_core: int | None = None


class UltraServerConfig(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"
):
    """How many nodes of the UltraServer the workload spans (1, 2 or 4)."""

    api_version: str
    kind: str
    ultraserver_mode: int | None = None


KINDS: dict[str, type[NeuronConfig] | type[UltraServerConfig]] = {
    "NeuronConfig": NeuronConfig,
    "UltraServerConfig": UltraServerConfig,
}


class DecodedConfig(msgspec.Struct, frozen=True, kw_only=True):
    """One decoded config entry; empty ``requests`` means every request of the claim."""

    index: int
    requests: tuple[str, ...]
    config: NeuronConfig | UltraServerConfig


class EffectiveConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What is in force for one request after precedence."""

    logical_neuron_core: int | None = None
    ultraserver_mode: int | None = None


def _one_of(values: Sequence[int]) -> str:
    return ", ".join(str(v) for v in values)


# msgspec reports "<what> - at `$.field`"; we rewrite `$` into the config's own path.
_AT = re.compile(r"^(?P<message>.*?)(?: - at `(?P<path>\$[^`]*)`)?$", re.DOTALL)


def _validation_message(exc: msgspec.ValidationError, prefix: str) -> str:
    match = _AT.match(str(exc))
    if match is None or match.group("path") is None:
        return f"{prefix}: {exc}"
    path = prefix + match.group("path")[1:]
    return f"{path}: {match.group('message')}"


def decode_parameters(parameters: Any, *, path: str) -> NeuronConfig | UltraServerConfig:
    """Decode one ``opaque.parameters`` object strictly; ``path`` prefixes error messages."""
    if not isinstance(parameters, dict):
        raise ConfigError(f"{path}: expected an object with apiVersion and kind")
    api_version = parameters.get("apiVersion")
    if api_version not in API_VERSIONS:
        raise ConfigError(
            f"{path}.apiVersion: {api_version!r} is not one of {', '.join(API_VERSIONS)}"
        )
    kind = parameters.get("kind")
    struct_type = KINDS.get(kind) if isinstance(kind, str) else None
    if struct_type is None:
        raise ConfigError(
            f"{path}.kind: {kind!r} is not a kind of {DRIVER_NAME} (known kinds: "
            f"{', '.join(KINDS)})"
        )
    try:
        decoded = msgspec.convert(parameters, type=struct_type, strict=True)
    except msgspec.ValidationError as exc:
        raise ConfigError(_validation_message(exc, path)) from exc
    if isinstance(decoded, NeuronConfig):
        value = decoded.logical_neuron_core
        if value is not None and value not in LOGICAL_NEURON_CORE_VALUES:
            raise ConfigError(
                f"{path}.logicalNeuronCore: {value} is not one of "
                f"{_one_of(LOGICAL_NEURON_CORE_VALUES)}"
            )
    else:
        value = decoded.ultraserver_mode
        if value is not None and value not in ULTRASERVER_MODE_VALUES:
            raise ConfigError(
                f"{path}.ultraserverMode: {value} is not one of {_one_of(ULTRASERVER_MODE_VALUES)}"
            )
    return decoded


def decode_configs(
    configs: Sequence[AllocationConfig], *, driver: str = DRIVER_NAME
) -> tuple[DecodedConfig, ...]:
    """Decode the allocation's configs for ``driver``, class configs first, order kept.

    Entries for other drivers and entries without ``opaque`` are skipped. The first invalid
    entry raises :class:`ConfigError`; its path uses the entry's index in ``configs``.
    """
    decoded: list[DecodedConfig] = []
    for index, entry in enumerate(configs):
        if entry.opaque is None or entry.opaque.driver != driver:
            continue
        config = decode_parameters(
            entry.opaque.parameters, path=f"config[{index}].opaque.parameters"
        )
        decoded.append(DecodedConfig(index=index, requests=entry.requests, config=config))
    # sorted() is stable: within each source the allocation's order is kept.
    return tuple(sorted(decoded, key=lambda d: configs[d.index].source != "FromClass"))


def _applies(entry: DecodedConfig, request: str) -> bool:
    if not entry.requests:
        return True
    return request in entry.requests or parent_request(request) in entry.requests


def effective_config(configs: Sequence[DecodedConfig], request: str) -> EffectiveConfig:
    """The config in force for ``request`` (``req`` or ``req/sub``): the last of each kind.

    >>> effective_config((), "neurons")
    EffectiveConfig(logical_neuron_core=None, ultraserver_mode=None)
    """
    neuron: NeuronConfig | None = None
    ultraserver: UltraServerConfig | None = None
    for entry in configs:
        if not _applies(entry, request):
            continue
        if isinstance(entry.config, NeuronConfig):
            neuron = entry.config
        else:
            ultraserver = entry.config
    return EffectiveConfig(
        logical_neuron_core=neuron.logical_neuron_core if neuron else None,
        ultraserver_mode=ultraserver.ultraserver_mode if ultraserver else None,
    )
