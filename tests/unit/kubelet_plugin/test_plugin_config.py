"""Opaque config decoding: every API spelling, strict fields, precedence, named errors."""

from __future__ import annotations

import pytest
from neuron_dra_kubelet_plugin.claims import AllocationConfig, OpaqueConfig
from neuron_dra_kubelet_plugin.config import (
    API_VERSIONS,
    ConfigError,
    EffectiveConfig,
    NeuronConfig,
    UltraServerConfig,
    decode_configs,
    decode_parameters,
    effective_config,
)

PATH = "config[0].opaque.parameters"


def entry(
    params: dict[str, object], *, source: str = "FromClaim", requests: tuple[str, ...] = ()
) -> AllocationConfig:
    return AllocationConfig(
        source=source,
        requests=requests,
        opaque=OpaqueConfig(driver="neuron.aws.com", parameters=params),
    )


@pytest.mark.parametrize("api_version", API_VERSIONS)
def test_every_api_spelling_decodes(api_version: str) -> None:
    decoded = decode_parameters(
        {"apiVersion": api_version, "kind": "NeuronConfig", "logicalNeuronCore": 1}, path=PATH
    )
    assert decoded == NeuronConfig(
        api_version=api_version, kind="NeuronConfig", logical_neuron_core=1
    )


def test_guide_ultraserver_config_decodes() -> None:
    decoded = decode_parameters(
        {
            "apiVersion": "neuron.aws.com/v1alphav1",
            "kind": "UltraServerConfig",
            "ultraserverMode": 4,
        },
        path=PATH,
    )
    assert isinstance(decoded, UltraServerConfig)
    assert decoded.ultraserver_mode == 4


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 3},
            f"{PATH}.logicalNeuronCore: 3 is not one of 1, 2",
        ),
        (
            {"apiVersion": "neuron.aws.com/v1", "kind": "UltraServerConfig", "ultraserverMode": 3},
            f"{PATH}.ultraserverMode: 3 is not one of 1, 2, 4",
        ),
        (
            {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": "1"},
            f"{PATH}.logicalNeuronCore: Expected `int | null`, got `str`",
        ),
        (
            {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "lnc": 1},
            f"{PATH}: Object contains unknown field `lnc`",
        ),
        (
            {"apiVersion": "neuron.aws.com/v1", "kind": "GpuConfig"},
            f"{PATH}.kind: 'GpuConfig' is not a kind of neuron.aws.com (known kinds: "
            "NeuronConfig, UltraServerConfig)",
        ),
        (
            {"apiVersion": "gpu.example.com/v1", "kind": "NeuronConfig"},
            f"{PATH}.apiVersion: 'gpu.example.com/v1' is not one of neuron.aws.com/v1, "
            "neuron.aws.com/v1alphav1, resource.neuron.aws.com/v1alphav1",
        ),
    ],
)
def test_bad_parameters_name_the_field(params: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        decode_parameters(params, path=PATH)
    assert str(info.value) == message


def test_error_path_uses_the_index_in_the_allocation() -> None:
    other = AllocationConfig(
        source="FromClaim", opaque=OpaqueConfig(driver="gpu.example.com", parameters={"x": 1})
    )
    bad = entry({"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 3})
    with pytest.raises(ConfigError, match=r"^config\[1\]\.opaque\.parameters\.logicalNeuronCore"):
        decode_configs([other, bad])


def test_other_drivers_configs_are_ignored() -> None:
    other = AllocationConfig(
        source="FromClaim", opaque=OpaqueConfig(driver="gpu.example.com", parameters="anything")
    )
    assert decode_configs([other]) == ()


def test_claim_config_overrides_class_config_whatever_the_order() -> None:
    lnc = {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig"}
    configs = decode_configs(
        [
            entry({**lnc, "logicalNeuronCore": 1}, source="FromClaim"),
            entry({**lnc, "logicalNeuronCore": 2}, source="FromClass"),
        ]
    )
    assert effective_config(configs, "neurons").logical_neuron_core == 1


def test_later_config_wins_and_requests_scope_it() -> None:
    lnc = {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig"}
    configs = decode_configs(
        [
            entry({**lnc, "logicalNeuronCore": 2}),
            entry({**lnc, "logicalNeuronCore": 1}, requests=("neurons",)),
            entry(
                {
                    "apiVersion": "neuron.aws.com/v1",
                    "kind": "UltraServerConfig",
                    "ultraserverMode": 2,
                },
                requests=("other",),
            ),
        ]
    )
    assert effective_config(configs, "neurons/four") == EffectiveConfig(logical_neuron_core=1)
    assert effective_config(configs, "other") == EffectiveConfig(
        logical_neuron_core=2, ultraserver_mode=2
    )
