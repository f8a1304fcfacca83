"""The extender's HTTP verbs as JSON in, JSON out: ``/filter``, ``/prioritize``, ``/bind``.

The paths are AWS's (``filterVerb: filter``, ``bindVerb: bind`` under the ``urlPrefix``), so
AWS's KubeSchedulerConfiguration works unchanged; ``/prioritize`` is ours, for a
configuration that asks for best-fit scores.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec

from neuron_dra_scheduler_extender.api import decode_args, decode_binding, encode
from neuron_dra_scheduler_extender.extender import Extender

__all__ = ["routes"]

Handler = Callable[[bytes], Awaitable[tuple[int, bytes]]]


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

    async def filter_(body: bytes) -> tuple[int, bytes]:
        if not ready():
            return _starting()
        try:
            args = decode_args(body)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            return _bad_request("filter", exc)
        await extender.settle(args.pod)
        return 200, encode(extender.filter(args))

    async def prioritize(body: bytes) -> tuple[int, bytes]:
        if not ready():
            return _starting()
        try:
            args = decode_args(body)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            return _bad_request("prioritize", exc)
        return 200, encode(extender.prioritize(args))

    async def bind(body: bytes) -> tuple[int, bytes]:
        if not ready():
            return _starting()
        try:
            args = decode_binding(body)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            return _bad_request("bind", exc)
        return 200, encode(await extender.bind(args))

    return {"/filter": filter_, "/prioritize": prioritize, "/bind": bind}
