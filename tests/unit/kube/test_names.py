"""A name or namespace that would change a request's path is refused before a byte is sent."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from neuron_dra_common.kube import (
    CONFIGMAPS,
    NODES,
    PODS,
    InvalidName,
    KubeClient,
    load_kubeconfig,
)


class Recorder:
    """A listening socket that records every byte any client sends it."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self.received = bytearray()
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            self.connections += 1
            with conn:
                conn.settimeout(0.5)
                try:
                    while data := conn.recv(65536):
                        self.received += data
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    served = Recorder()
    try:
        yield served
    finally:
        served.close()


@pytest.fixture
async def client(recorder: Recorder, tmp_path: Path) -> Any:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "clusters": [
                    {"name": "c", "cluster": {"server": f"http://127.0.0.1:{recorder.port}"}}
                ],
                "contexts": [{"name": "x", "context": {"cluster": "c"}}],
                "current-context": "x",
            }
        )
    )
    made = KubeClient(await load_kubeconfig(kubeconfig))
    try:
        yield made
    finally:
        await made.close()


Call = Callable[[KubeClient], Awaitable[object]]


@pytest.mark.parametrize(
    ("call", "said"),
    [
        (lambda c: c.get(CONFIGMAPS, "a\r\nHost: evil", namespace="default"), "control"),
        (lambda c: c.get(NODES, "a\nb"), "control"),
        (lambda c: c.get(NODES, "../secrets/x"), "'/'"),
        (lambda c: c.get(NODES, ".."), "'.' or '..'"),
        (lambda c: c.get(NODES, ""), "empty"),
        (lambda c: c.get(NODES, "a%2Fb"), "'%'"),
        (lambda c: c.delete(CONFIGMAPS, "ok", namespace="kube-system/../x"), "namespace"),
        (lambda c: c.delete(CONFIGMAPS, "ok", namespace="De fault"), "namespace"),
        (lambda c: c.patch(NODES, "n/../../x", {}), "'/'"),
        (
            lambda c: c.create(PODS, {}, namespace="default", name="p\r\n", subresource="binding"),
            "control",
        ),
        (lambda c: c.get(NODES, "n1", subresource="status/../x"), "subresource"),
        (lambda c: c.list(CONFIGMAPS, namespace="a/b"), "namespace"),
        (
            lambda c: c.post_event(
                {"kind": "Node", "name": "n\r\n1"}, reason="r", message="m", component="t"
            ),
            "involvedObject.name",
        ),
    ],
)
async def test_refused_before_a_byte_is_sent(
    client: KubeClient, recorder: Recorder, call: Call, said: str
) -> None:
    with pytest.raises(InvalidName, match=said) as caught:
        await call(client)
    assert "\n" not in str(caught.value).replace("\\n", "")
    await asyncio.sleep(0.3)
    assert recorder.connections == 0
    assert bytes(recorder.received) == b""


async def test_a_good_name_does_reach_the_socket(client: KubeClient, recorder: Recorder) -> None:
    # The same client and socket, with a valid name: the request is sent (and unanswered).
    with pytest.raises((TimeoutError, OSError)):
        await asyncio.wait_for(client.get(NODES, "trn2-0"), 1.0)
    await asyncio.sleep(0.3)
    assert b"GET /api/v1/nodes/trn2-0 HTTP/1.1" in bytes(recorder.received)
