"""Fuzzing the plugin's DRA gRPC service over its real unix socket, as a broken or hostile
kubelet-side client would call it: random bytes as the request, and well-formed requests whose
claims carry any UID, namespace and name (empty, huge, repeated, not UTF-8 safe).

Whatever comes in, the server answers (bytes that are no protobuf of the method's request are
refused with INVALID_ARGUMENT, naming the message type and "Error parsing"; everything it can parse
is answered claim by claim, each error naming the claim) and goes on serving: a good prepare afterwards
works. The mix is seeded (``NEURON_DRA_FUZZ_SEED``) and sized by ``NEURON_DRA_FUZZ_MESSAGES``.
"""

from __future__ import annotations

import random
import string

import grpc
from neuron_dra_kubelet_plugin.health import StaticHealth
from neuron_dra_kubelet_plugin.servers import PluginServers
from neuron_dra_protos.dra.v1 import dra_pb2 as v1
from neuron_dra_protos.dra.v1 import dra_pb2_grpc as v1_grpc

from tests.contracts.fuzz import fuzz_count, fuzz_seed

METHODS = (
    "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
    "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
    "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
    "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
)
#: Claims the fixture's API knows (a fuzzed call may name them too).
KNOWN = (("u-1x4", "pod0-neurons"), ("u-lnc1", "lnc1"), ("u-bad", "bad"), ("u-sub", "sub"))


def _text(rng: random.Random) -> str:
    kind = rng.randrange(6)
    if kind == 0:
        return ""
    if kind == 1:
        return "x" * rng.choice((253, 254, 4096))
    if kind == 2:
        return "".join(
            rng.choice("\u00e9\u4e2d\U0001f600/.. \t\n") for _ in range(rng.randrange(1, 9))
        )
    return "".join(rng.choice(string.ascii_lowercase + "-.") for _ in range(rng.randrange(1, 20)))


def _claims(rng: random.Random) -> list[v1.Claim]:
    claims = []
    for _ in range(rng.randrange(0, 6)):
        if rng.random() < 0.3:
            uid, name = rng.choice(KNOWN)
            claims.append(v1.Claim(namespace="default", name=name, uid=uid))
        else:
            claims.append(v1.Claim(namespace=_text(rng), name=_text(rng), uid=_text(rng)))
    if claims and rng.random() < 0.2:
        claims.append(claims[0])  # the same claim twice in one call
    return claims


async def test_any_request_is_answered_and_the_server_keeps_serving(
    plugin: tuple[PluginServers, StaticHealth],
) -> None:
    servers, _ = plugin
    rng = random.Random(fuzz_seed())
    count = fuzz_count(120)
    refused = answered = 0
    async with grpc.aio.insecure_channel(servers.dra.target) as channel:
        for i in range(count):
            method = rng.choice(METHODS)
            # Raw bytes in and out.
            call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(method)
            if rng.random() < 0.5:
                body = rng.randbytes(rng.randrange(0, 300))
            else:
                request = v1.NodePrepareResourcesRequest(claims=_claims(rng))
                body = request.SerializeToString()
                if rng.random() < 0.3 and body:
                    body = body[: rng.randrange(len(body))]  # cut short
            try:
                raw = await call(body, timeout=30)
            except grpc.aio.AioRpcError as exc:
                failed: grpc.aio.AioRpcError | None = exc
            else:
                failed = None
            if failed is not None:
                # Only what protobuf cannot parse is refused as a whole call.
                assert "Error parsing message" in (failed.details() or ""), (i, method, failed)
                assert failed.code() == grpc.StatusCode.INVALID_ARGUMENT, (i, method, failed)
                refused += 1
                continue
            answered += 1
            # Both calls' requests carry the claims as field 1 alike, as do their answers.
            sent = v1.NodePrepareResourcesRequest.FromString(body)
            answer = (
                v1.NodePrepareResourcesResponse
                if method.endswith("/NodePrepareResources")
                else v1.NodeUnprepareResourcesResponse
            )
            response = answer.FromString(raw)
            # Every claim of the call is answered under its UID, and nothing else is.
            assert set(response.claims) == {c.uid for c in sent.claims}, (i, method)
            for uid, result in response.claims.items():
                if result.error:
                    assert uid in result.error or "ResourceClaim" in result.error, (uid, result)
        assert refused + answered == count
        # And it still prepares a good claim.
        stub = v1_grpc.DRAPluginStub(channel)
        good = await stub.NodePrepareResources(
            v1.NodePrepareResourcesRequest(
                claims=[v1.Claim(namespace="default", name="pod0-neurons", uid="u-1x4")]
            ),
            timeout=30,
        )
    assert good.claims["u-1x4"].error == ""
    assert len(good.claims["u-1x4"].devices) == 4
    print(f"{count} calls: {answered} answered claim by claim, {refused} refused as unparsable")
