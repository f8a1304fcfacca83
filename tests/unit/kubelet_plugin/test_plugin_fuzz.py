"""Fuzzing what users and the kubelet hand the plugin: opaque configs, claims, prepare calls.

Whatever a claim carries, prepare answers each claim of the call with its devices or with an
error that starts with the claim and names what is wrong; it never fails the call, never
answers with an "internal error", and never hands one Neuron device to two claims.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from neuron_dra_common.driver import NODE_DEVICE, device_index
from neuron_dra_kubelet_plugin.checkpoint import CheckpointStore
from neuron_dra_kubelet_plugin.claims import ClaimRef
from neuron_dra_kubelet_plugin.claimsource import ApiClaimSource
from neuron_dra_kubelet_plugin.config import (
    API_VERSIONS,
    KINDS,
    LOGICAL_NEURON_CORE_VALUES,
    ULTRASERVER_MODE_VALUES,
    ConfigError,
    NeuronConfig,
    decode_parameters,
)
from neuron_dra_kubelet_plugin.draservice import DraPlugin, DraService
from neuron_dra_kubelet_plugin.preparer import Effects, NodePreparer
from neuron_dra_protos.dra.v1 import dra_pb2 as v1

from tests.contracts.jsonfuzz import json_values, spoiled
from tests.unit.kubelet_plugin.support import NODE, claim_json, opaque, trn2u_node

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PATH = "config[0].opaque.parameters"

# --- opaque configs ---------------------------------------------------------------------------

config_keys = st.sampled_from(
    ["apiVersion", "kind", "logicalNeuronCore", "ultraserverMode", "logical_neuron_core", "x"]
)


@st.composite
def config_shaped(draw: st.DrawFn) -> dict[str, Any]:
    """Parameters that look like a config: mostly the right keys, any values."""
    body = draw(st.dictionaries(config_keys, json_values, max_size=4))
    if draw(st.booleans()):
        body["apiVersion"] = draw(st.sampled_from(API_VERSIONS))
    if draw(st.booleans()):
        body["kind"] = draw(st.sampled_from(sorted(KINDS)))
    if draw(st.booleans()):
        key = draw(st.sampled_from(["logicalNeuronCore", "ultraserverMode"]))
        body[key] = draw(st.integers(-3, 9) | st.booleans() | st.text(max_size=2))
    return body


@FUZZ
@given(parameters=st.one_of(json_values, config_shaped()))
def test_any_opaque_parameters_decode_to_a_valid_config_or_an_error_naming_the_field(
    parameters: Any,
) -> None:
    try:
        decoded = decode_parameters(parameters, path=PATH)
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith(PATH), message
        # The error names the field (``<path>.<field>``, or an unknown one in backticks) or
        # says what the object lacks.
        named = message[len(PATH) :]
        unknown = isinstance(parameters, dict) and any(f"`{k}`" in named for k in parameters)
        assert named.startswith((".", "[")) or unknown or "apiVersion and kind" in named, message
        return
    assert decoded.api_version in API_VERSIONS
    if isinstance(decoded, NeuronConfig):
        assert decoded.logical_neuron_core in (None, *LOGICAL_NEURON_CORE_VALUES)
        assert type(decoded.logical_neuron_core) is not bool
    else:
        assert decoded.ultraserver_mode in (None, *ULTRASERVER_MODE_VALUES)
        assert type(decoded.ultraserver_mode) is not bool


# --- claims through a prepare call ------------------------------------------------------------


devices = st.lists(
    st.sampled_from([*range(16), NODE_DEVICE, "neurondevice99", "gpu0", ""]), min_size=1, max_size=4
)
configs = st.lists(
    st.sampled_from(
        [
            opaque("NeuronConfig", logicalNeuronCore=1),
            opaque("NeuronConfig", logicalNeuronCore=2),
            opaque("NeuronConfig", logicalNeuronCore=3),
            opaque("UltraServerConfig", ultraserverMode=1),
            opaque("UltraServerConfig", ultraserverMode=4),
            opaque("NoSuchConfig"),
        ]
    ),
    max_size=2,
)


@st.composite
def claims(draw: st.DrawFn, index: int) -> tuple[ClaimRef, Any]:
    """A claim the kubelet names and what the API returns for it, possibly spoiled."""
    uid = f"uid-{index}"
    obj = claim_json(
        uid,
        draw(devices),
        pool=draw(st.sampled_from([NODE, NODE, "another-node"])),
        request=draw(st.sampled_from(["neurons", "neurons/four", ""])),
        config=draw(configs),
    )
    if draw(st.booleans()):
        obj = draw(spoiled(obj))
    ref = ClaimRef(namespace="default", name=f"claim-{uid}", uid=uid)
    if draw(st.integers(0, 9)) == 0:
        ref = ClaimRef(namespace="default", name=ref.name, uid=draw(st.sampled_from(["", "other"])))
    return ref, obj


class ApiDicts:
    """What the API returns for each claim name: any JSON at all."""

    def __init__(self, objects: dict[str, Any]) -> None:
        self.objects = objects

    async def get(self, resource: Any, name: str, *, namespace: str | None = None) -> Any:
        return self.objects[name]


def _chips(device: str) -> set[int]:
    if device == NODE_DEVICE:
        return set(range(16))
    index = device_index(device)
    assert index is not None, device
    return {index}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    calls=st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=3), max_size=3), data=st.data()
)
def test_a_prepare_call_with_malformed_claims_answers_every_claim_and_shares_no_device(
    calls: list[list[int]], data: st.DataObject
) -> None:
    wanted = sorted({i for call in calls for i in call})
    drawn = {i: data.draw(claims(i)) for i in wanted}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        preparer = NodePreparer(
            node=trn2u_node(),
            claims=ApiClaimSource(ApiDicts({ref.name: obj for ref, obj in drawn.values()})),
            effects=Effects(store=CheckpointStore(root / "checkpoint.json"), cdi_root=root / "cdi"),
            boot_id="b1",
        )
        preparer.recover()
        plugin = DraPlugin(DraService(preparer), messages=v1)
        held: dict[int, str] = {}  # chip -> the claim UID it was prepared for
        for call in calls:
            refs = [drawn[i][0] for i in call]
            request = v1.NodePrepareResourcesRequest(
                claims=[v1.Claim(namespace=r.namespace, name=r.name, uid=r.uid) for r in refs]
            )
            response = asyncio.run(plugin.prepare(request))
            assert set(response.claims) == {r.uid for r in refs}
            for ref in refs:
                answer = response.claims[ref.uid]
                if answer.error:
                    named = {str(r) for r in refs if r.uid == ref.uid}
                    assert answer.error.startswith(tuple(named)), answer.error
                    assert "internal error" not in answer.error, answer.error
                    assert not answer.devices
                    continue
                assert ref.uid, f"{ref}: prepared without a UID"
                assert answer.devices, f"{ref}: neither devices nor an error"
                for device in answer.devices:
                    assert device.pool_name == NODE
                    for chip in _chips(device.device_name):
                        assert held.setdefault(chip, ref.uid) == ref.uid, (
                            f"neurondevice{chip} prepared for {held[chip]} and {ref.uid}"
                        )


def _prepare_call(refs: list[ClaimRef], objects: dict[str, Any]) -> dict[str, str]:
    """Errors by UID of one NodePrepareResources call on a fresh node ("" when prepared)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        preparer = NodePreparer(
            node=trn2u_node(),
            claims=ApiClaimSource(ApiDicts(objects)),
            effects=Effects(store=CheckpointStore(root / "checkpoint.json"), cdi_root=root / "cdi"),
            boot_id="b1",
        )
        preparer.recover()
        request = v1.NodePrepareResourcesRequest(
            claims=[v1.Claim(namespace=r.namespace, name=r.name, uid=r.uid) for r in refs]
        )
        plugin = DraPlugin(DraService(preparer), messages=v1)
        response = asyncio.run(plugin.prepare(request))
        return {uid: answer.error for uid, answer in response.claims.items()}


def test_two_claims_under_one_uid_are_both_refused_rather_than_one_answering_for_both() -> None:
    # Found by fuzzing: the response holds one entry per UID, so the second claim's answer
    # used to stand for the first, which the kubelet then believed prepared.
    first = ClaimRef(namespace="default", name="claim-a", uid="u1")
    second = ClaimRef(namespace="default", name="claim-b", uid="u1")
    objects = {
        "claim-a": claim_json("u1", [0], name="claim-a"),
        "claim-b": claim_json("u1", [1], name="claim-b"),
    }
    errors = _prepare_call([first, second], objects)
    assert errors == {
        "u1": "ResourceClaim default/claim-b: UID u1 is also given to ResourceClaim "
        "default/claim-a in this request"
    }
    # The same claim named twice is one claim: prepared once.
    assert _prepare_call([first, first], objects) == {"u1": ""}


def test_a_claim_the_request_gives_no_uid_is_refused_not_prepared() -> None:
    # Its claim object has no UID either, so nothing else would have told them apart.
    ref = ClaimRef(namespace="default", name="claim-x", uid="")
    errors = _prepare_call([ref], {"claim-x": claim_json("", [0], name="claim-x")})
    assert errors == {"": "ResourceClaim default/claim-x: the request names no claim uid"}
