"""A no-op scheduler extender, the reference the ``extender`` benchmark sets ours against.

``python -m bench.noop_extender --port P --kubeconfig FILE``: an HTTP extender that decides
nothing. ``filter`` keeps every node it is given (``NodeNames`` or ``Nodes``, as configured),
``prioritize`` scores each 0, ``bind`` posts the Binding and nothing else. Served the same way
as the product's extender (JSON endpoints of the service runtime's HTTP server, on uvloop, in
one process, with the same Kubernetes client), it costs kube-scheduler what any extender
costs it: two HTTP round trips per pod in the scheduling cycle, the JSON of the pod and the
node lists both ways, and a bind through a client of its own. Its pods/s is therefore the
most an extender of this kind can reach through that scheduler on that machine, and ours is
measured against it as well as against the scheduler alone.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import msgspec
import uvloop
from neuron_dra_common.kube import KubeClient, load_kubeconfig
from neuron_dra_common.runtime import HealthServer
from neuron_dra_scheduler_extender.cluster import PODS
from neuron_dra_scheduler_extender.verbs import body_limits

__all__ = ["answer_filter", "answer_prioritize", "binding", "main"]

_decode = msgspec.json.Decoder(dict[str, Any])
_encode = msgspec.json.Encoder()


def answer_filter(args: dict[str, Any]) -> dict[str, Any]:
    """Every node asked about fits, in the form it was asked in.

    >>> answer_filter({"Pod": {}, "NodeNames": ["a", "b"]})
    {'NodeNames': ['a', 'b'], 'FailedNodes': {}, 'Error': ''}
    >>> answer_filter({"Pod": {}, "Nodes": {"items": [{"metadata": {"name": "a"}}]}})["Nodes"]
    {'items': [{'metadata': {'name': 'a'}}]}
    """
    if args.get("NodeNames") is not None:
        return {"NodeNames": args["NodeNames"], "FailedNodes": {}, "Error": ""}
    return {"Nodes": args.get("Nodes") or {"items": []}, "FailedNodes": {}, "Error": ""}


def answer_prioritize(args: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node asked about scores 0.

    >>> answer_prioritize({"Pod": {}, "NodeNames": ["a"]})
    [{'Host': 'a', 'Score': 0}]
    >>> answer_prioritize({"Pod": {}, "Nodes": {"items": [{"metadata": {"name": "b"}}]}})
    [{'Host': 'b', 'Score': 0}]
    """
    names = args.get("NodeNames")
    if names is None:
        names = [n["metadata"]["name"] for n in (args.get("Nodes") or {}).get("items") or []]
    return [{"Host": name, "Score": 0} for name in names]


def binding(args: dict[str, Any]) -> dict[str, Any]:
    """The Binding a ``bind`` call asks for (the pod's uid as its precondition).

    >>> binding({"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "n"})["target"]
    {'apiVersion': 'v1', 'kind': 'Node', 'name': 'n'}
    """
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": args["PodName"],
            "namespace": args["PodNamespace"],
            "uid": args.get("PodUID", ""),
        },
        "target": {"apiVersion": "v1", "kind": "Node", "name": args["Node"]},
    }


async def serve(port: int, kubeconfig: Path) -> None:
    kube = KubeClient(await load_kubeconfig(kubeconfig))

    async def filter_(body: bytes | bytearray) -> tuple[int, bytes]:
        return 200, _encode.encode(answer_filter(_decode.decode(body)))

    async def prioritize(body: bytes | bytearray) -> tuple[int, bytes]:
        return 200, _encode.encode(answer_prioritize(_decode.decode(body)))

    async def bind(body: bytes | bytearray) -> tuple[int, bytes]:
        args = _decode.decode(body)
        try:
            await kube.create(
                PODS,
                binding(args),
                namespace=args["PodNamespace"],
                name=args["PodName"],
                subresource="binding",
            )
        except Exception as exc:  # the scheduler retries the pod, with the reason
            return 200, _encode.encode({"Error": str(exc)})
        return 200, _encode.encode({"Error": ""})

    # /readyz is the server's own: ready at once, with no checks to pass.
    http = HealthServer(host="127.0.0.1", port=port)
    # The same body limits as the product's extender.
    limits = body_limits()
    for path, handler in {"/filter": filter_, "/prioritize": prioritize, "/bind": bind}.items():
        http.add_json_post(path, handler, max_body=limits[path])
    await http.start()
    try:
        await asyncio.Event().wait()
    finally:
        await http.stop()
        await kube.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.noop_extender", description=__doc__)
    parser.add_argument("--port", type=int, required=True, help="loopback port to serve on")
    parser.add_argument(
        "--kubeconfig", type=Path, required=True, help="kubeconfig the binds are made with"
    )
    args = parser.parse_args(argv)
    uvloop.run(serve(args.port, args.kubeconfig))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
