"""The extender's HTTP verbs as JSON in, JSON out: ``/filter``, ``/prioritize``, ``/bind``.

The paths are AWS's (``filterVerb: filter``, ``bindVerb: bind`` under the ``urlPrefix``), so
AWS's KubeSchedulerConfiguration works unchanged; ``/prioritize`` is ours, for a
configuration that asks for best-fit scores.

Each verb reads a bounded body (:func:`body_limits`): ``filter`` and ``prioritize`` what a
scheduler with ``nodeCacheCapable: true`` sends (the pod and node names, at most
:data:`ARGS_MAX_BODY` unless configured otherwise), ``bind`` a pod's and a node's names.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

import msgspec

from neuron_dra_scheduler_extender.api import decode_args, decode_binding, encode
from neuron_dra_scheduler_extender.extender import Extender

__all__ = ["ARGS_MAX_BODY", "BIND_MAX_BODY", "body_limits", "routes"]

Handler = Callable[[bytes | bytearray], Awaitable[tuple[int, bytes]]]

#: The largest ``filter`` or ``prioritize`` body read by default: what a scheduler with
#: ``nodeCacheCapable: true`` sends on the largest cluster Kubernetes supports, with room to
#: spare: the largest Pod etcd stores (1.5 MiB, its request limit) and 5,000 node names of the
#: longest DNS name (253 bytes, quoted: about 1.3 MB). A scheduler that sends whole Nodes
#: (``nodeCacheCapable: false``, a few KiB each) needs more on a large cluster: the
#: extender's ``--max-args-bytes``.
ARGS_MAX_BODY: Final = 4 * 2**20
#: The largest ``bind`` body: a pod's name, namespace and uid and a node's name.
BIND_MAX_BODY: Final = 16 * 2**10


def body_limits(*, args_max_body: int = ARGS_MAX_BODY) -> dict[str, int]:
    """Path -> the largest body the verb reads."""
    return {"/filter": args_max_body, "/prioritize": args_max_body, "/bind": BIND_MAX_BODY}


def _bad_request(verb: str, exc: Exception) -> tuple[int, bytes]:
    return 400, encode({"Error": f"{verb}: the request body is not extender v1 JSON: {exc}"})


def _starting() -> tuple[int, bytes]:
    # Answered until the pod watch has listed: deciding before the annotations are read back
    # would hand out devices that bound pods hold. The scheduler tries the pod again.
    return 200, encode(
        {"Error": "the Neuron extender is starting: it has not read the cluster's pods yet"}
    )


def routes(extender: Extender, *, ready: Callable[[], bool]) -> dict[str, Handler]:
    """Path -> handler, for the service's HTTP server; until ``ready()`` every verb answers
    with an error."""

    async def filter_(body: bytes | bytearray) -> tuple[int, bytes]:
        if not ready():
            return _starting()
        try:
            args = decode_args(body)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            return _bad_request("filter", exc)
        await extender.settle(args.pod)
        return 200, encode(extender.filter(args))

    async def prioritize(body: bytes | bytearray) -> tuple[int, bytes]:
        if not ready():
            return _starting()
        try:
            args = decode_args(body)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            return _bad_request("prioritize", exc)
        return 200, encode(extender.prioritize(args))

    async def bind(body: bytes | bytearray) -> tuple[int, bytes]:
        if not ready():
            return _starting()
        try:
            args = decode_binding(body)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            return _bad_request("bind", exc)
        return 200, encode(await extender.bind(args))

    return {"/filter": filter_, "/prioritize": prioritize, "/bind": bind}
