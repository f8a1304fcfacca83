"""The transport against the real apiserver: whom it trusts, which proxy it takes, and what
happens to a credential plugin that hangs.

- A kubeconfig's CA is the only CA trusted: the system's store (here ``SSL_CERT_FILE``) may
  hold the CA that signed the server, and the server is still refused when the kubeconfig
  names another one.
- ``NO_PROXY`` with a CIDR takes the apiserver's IP past the proxy, as Go's clients do; a
  forward proxy (a small CONNECT relay that records what it is asked) sees no CONNECT.
- ``proxy-url`` credentials reach the proxy as ``Proxy-Authorization``.
- An exec plugin that hangs is killed at its timeout (its process is gone), the calls made
  meanwhile are answered with the last token, and the next good run of the plugin is used.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from neuron_dra_cli.stack.pki import Pki
from neuron_dra_common.kube import ApiException, KubeClient, Resource, connect

from tests.contracts.support import wait_until
from tests.fixtures.stack import KubeStack
from tests.integration.kube.relay import Cuttable

pytestmark = pytest.mark.stack

NS = "default"
SELF_SUBJECT_REVIEWS = Resource(
    group="authentication.k8s.io", version="v1", plural="selfsubjectreviews"
)
#: A non-loopback address of this machine (Go never proxies loopback ones).
OUTSIDE = "192.0.2.2"


async def who(client: KubeClient) -> str:
    review = await client.create(
        SELF_SUBJECT_REVIEWS,
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    return str(review["status"]["userInfo"]["username"])


def stack_doc(kube_stack: KubeStack) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(kube_stack.kubeconfig.read_text())
    return doc


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


class ConnectProxy:
    """A forward proxy for ``CONNECT`` only: records each request line and its headers,
    then relays the tunnel."""

    def __init__(self) -> None:
        self.connects: list[tuple[str, dict[str, str]]] = []
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        this = asyncio.current_task()
        assert this is not None
        self.tasks.add(this)
        ends = [writer]
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            line, *fields = head.decode("latin-1").split("\r\n")[:-2]
            headers = {k.strip().lower(): v.strip() for k, v in (f.split(":", 1) for f in fields)}
            self.connects.append((line, headers))
            method, target, _ = line.split(" ", 2)
            if method != "CONNECT":
                writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                return
            host, _, port = target.rpartition(":")
            up_reader, up_writer = await asyncio.open_connection(host.strip("[]"), int(port))
            ends.append(up_writer)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")

            async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                with contextlib.suppress(OSError):
                    while data := await src.read(65536):
                        dst.write(data)
                        await dst.drain()
                dst.close()

            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for end in ends:
                end.transport.abort()
            self.tasks.discard(this)

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.server.wait_closed()


@pytest.fixture
async def proxy() -> AsyncIterator[ConnectProxy]:
    made = ConnectProxy()
    await made.start()
    try:
        yield made
    finally:
        await made.stop()


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _other_ca(
    cluster: dict[str, Any], tmp_path: Path
) -> tuple[Path, Path, dict[str, Any], dict[str, Any]]:
    """A bundle holding the stack's CA, another CA, and the cluster entry naming that other
    CA by file and inline."""
    bundle = tmp_path / "system-bundle.pem"
    bundle.write_bytes(Path(cluster["certificate-authority"]).read_bytes())
    other = Pki(tmp_path / "other-pki").ca.cert
    by_file = {**cluster, "certificate-authority": str(other)}
    inline = {k: v for k, v in cluster.items() if k != "certificate-authority"}
    inline["certificate-authority-data"] = base64.b64encode(other.read_bytes()).decode()
    return bundle, other, by_file, inline


async def test_the_kubeconfigs_ca_is_the_only_ca_trusted(
    kube_stack: KubeStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = stack_doc(kube_stack)
    cluster = doc["clusters"][0]["cluster"]
    # The system's store trusts the CA that signed the apiserver's certificate...
    bundle, other, by_file, inline = _other_ca(cluster, tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    # ...and the kubeconfig names another CA, by file and inline.
    for variant, cluster_entry in (("file", by_file), ("data", inline)):
        doc["clusters"][0]["cluster"] = cluster_entry
        client = await connect(kubeconfig=write(tmp_path / f"other-ca-{variant}", doc))
        try:
            with pytest.raises(OSError, match="certificate verify failed"):
                await who(client)
        finally:
            await client.close()
    # The stack's own CA in the kubeconfig is trusted (and only it is needed).
    monkeypatch.setenv("SSL_CERT_FILE", str(other))
    doc["clusters"][0]["cluster"] = cluster
    client = await connect(kubeconfig=write(tmp_path / "own-ca", doc))
    try:
        assert await who(client) == "kubernetes-admin"
    finally:
        await client.close()


@pytest.fixture
async def outside(kube_stack: KubeStack) -> AsyncIterator[tuple[str, int]]:
    """The apiserver on a non-loopback address of this machine (a relay to it)."""
    server = stack_doc(kube_stack)["clusters"][0]["cluster"]["server"]
    host, _, port = server.removeprefix("https://").rpartition(":")
    relay = Cuttable(host, int(port))
    try:
        relay.server = await asyncio.start_server(relay._relay, OUTSIDE, 0)
    except OSError:
        pytest.skip(f"{OUTSIDE} is not an address of this machine")
    try:
        yield OUTSIDE, relay.server.sockets[0].getsockname()[1]
    finally:
        await relay.cut()


async def test_no_proxy_with_a_cidr_bypasses_the_proxy(
    kube_stack: KubeStack,
    tmp_path: Path,
    proxy: ConnectProxy,
    outside: tuple[str, int],
    no_proxy_env: pytest.MonkeyPatch,
) -> None:
    host, port = outside
    doc = stack_doc(kube_stack)
    cluster = doc["clusters"][0]["cluster"]
    cluster["server"] = f"https://{host}:{port}"
    cluster["tls-server-name"] = "localhost"  # a name the apiserver's certificate holds
    kubeconfig = write(tmp_path / "outside", doc)
    assert proxy.server is not None
    proxy_address = f"127.0.0.1:{proxy.server.sockets[0].getsockname()[1]}"
    no_proxy_env.setenv("HTTPS_PROXY", f"http://{proxy_address}")

    # Without a matching NO_PROXY entry the proxy is used...
    no_proxy_env.setenv("NO_PROXY", "example.com")
    client = await connect(kubeconfig=kubeconfig)
    try:
        assert await who(client) == "kubernetes-admin"
    finally:
        await client.close()
    assert [line for line, _ in proxy.connects] == [f"CONNECT {host}:{port} HTTP/1.1"]

    # ...with a CIDR that holds the server's address, it is not.
    proxy.connects.clear()
    no_proxy_env.setenv("NO_PROXY", "example.com,192.0.2.0/24")
    client = await connect(kubeconfig=kubeconfig)
    try:
        assert await who(client) == "kubernetes-admin"
        assert await who(client) == "kubernetes-admin"
    finally:
        await client.close()
    assert proxy.connects == []


async def test_proxy_url_credentials_reach_the_proxy(
    kube_stack: KubeStack,
    tmp_path: Path,
    proxy: ConnectProxy,
    no_proxy_env: pytest.MonkeyPatch,
) -> None:
    assert proxy.server is not None
    address = f"127.0.0.1:{proxy.server.sockets[0].getsockname()[1]}"
    doc = stack_doc(kube_stack)
    doc["clusters"][0]["cluster"]["proxy-url"] = f"http://user%40corp:s3cret@{address}"
    client = await connect(kubeconfig=write(tmp_path / "proxied", doc))
    try:
        assert await who(client) == "kubernetes-admin"
    finally:
        await client.close()
    [(line, headers)] = proxy.connects
    assert line.startswith("CONNECT 127.0.0.1:")
    expected = "Basic " + base64.b64encode(b"user@corp:s3cret").decode()
    assert headers["proxy-authorization"] == expected


def _credential(token: str, *, expires_in: timedelta) -> str:
    expiry = (datetime.now(UTC) + expires_in).strftime("%Y-%m-%dT%H:%M:%SZ")
    return json.dumps(
        {
            "apiVersion": "client.authentication.k8s.io/v1",
            "kind": "ExecCredential",
            "status": {"token": token, "expirationTimestamp": expiry},
        }
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_hung_exec_plugin_is_killed_and_never_blocks_a_call(
    kube_stack: KubeStack, tmp_path: Path
) -> None:
    accounts = {}
    for account in ("exec-first", "exec-second"):
        kube_stack.kubectl("create", "serviceaccount", account, "-n", NS, check=False)
        accounts[account] = kube_stack.kubectl("create", "token", account, "-n", NS).stdout.strip()
    mode, answer, pid_file = tmp_path / "mode", tmp_path / "answer", tmp_path / "pid"
    plugin = tmp_path / "get-token"
    plugin.write_text(
        "#!/bin/sh\n"
        f'if [ "$(cat {mode})" = hang ]; then echo $$ > {pid_file}; exec sleep 600; fi\n'
        f"cat {answer}\n"
    )
    plugin.chmod(0o755)
    mode.write_text("answer")
    # The library asks again from 5 minutes before the stated expiry: in a few seconds.
    answer.write_text(_credential(accounts["exec-first"], expires_in=timedelta(seconds=303)))
    doc = stack_doc(kube_stack)
    doc["users"][0]["user"] = {
        "exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin)}
    }
    client = await connect(kubeconfig=write(tmp_path / "exec", doc), exec_timeout=2)
    try:
        assert await who(client) == f"system:serviceaccount:{NS}:exec-first"
        mode.write_text("hang")
        await wait_until(pid_file.exists, within=20, what="the plugin run again, and hanging")
        pid = int(pid_file.read_text())
        # While it hangs, calls are answered at once with the last token.
        began = time.monotonic()
        assert await who(client) == f"system:serviceaccount:{NS}:exec-first"
        assert time.monotonic() - began < 1.0
        await wait_until(lambda: not _alive(pid), within=5, what=f"plugin {pid} killed")
        # The next good run is used.
        answer.write_text(_credential(accounts["exec-second"], expires_in=timedelta(hours=1)))
        mode.write_text("answer")

        async def second() -> bool:
            return await who(client) == f"system:serviceaccount:{NS}:exec-second"

        deadline = time.monotonic() + 30
        while not await second():
            assert time.monotonic() < deadline, "the plugin's new token was never used"
            await asyncio.sleep(0.5)
        # A token the server refuses (its account deleted) makes the plugin run again at once.
        answer.write_text(_credential(accounts["exec-first"], expires_in=timedelta(hours=1)))
        kube_stack.kubectl("delete", "serviceaccount", "exec-second", "-n", NS)
        deadline = time.monotonic() + 30
        refusals: list[int] = []
        while True:
            try:
                if await who(client) == f"system:serviceaccount:{NS}:exec-first":
                    break
            except ApiException as exc:
                refusals.append(exc.status)
            assert time.monotonic() < deadline, "a refused token was never replaced"
            await asyncio.sleep(0.5)
        assert set(refusals) <= {401}, refusals
    finally:
        await client.close()
