"""Who may call the extender's verbs: only a client with a certificate from the extender's
own CA (kube-scheduler's), and even it cannot bind a pod the extender does not place. Each
attempt is made as the attacker would, against the real extender and apiserver, and the pod
it aims at is checked afterwards: still unbound."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from neuron_dra_cli.stack.pki import Pki
from neuron_dra_cli.stack.realdeviceplugin import extender_tls
from neuron_dra_common.runtime import HealthServer, HttpLimits
from neuron_dra_scheduler_extender.settings import ExtenderSettings
from neuron_dra_scheduler_extender.tls import server_context

from tests.integration.extender.conftest import NAMESPACE, ExtenderCluster
from tests.integration.extender.test_extender_scheduling import neuron_pod

NOT_MANAGED = (
    "the pod asks for no aws.amazon.com/neuron, aws.amazon.com/neurondevice or "
    "aws.amazon.com/neuroncore, and the Neuron extender places and binds only pods that do"
)


def plain_pod(name: str) -> dict[str, Any]:
    """A pod that asks for nothing Neuron (and could carry any Secret), left to no scheduler:
    the only way it gets a node is a bind someone else calls."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "schedulerName": "nobody",
            "containers": [{"name": "main", "image": "busybox"}],
        },
    }


def bind_args(cluster: ExtenderCluster, name: str, node: str = "trn2-attack") -> dict[str, Any]:
    uid = cluster.pod(name)["metadata"]["uid"]
    return {"PodName": name, "PodNamespace": NAMESPACE, "PodUID": uid, "Node": node}


def unbound(cluster: ExtenderCluster, name: str) -> bool:
    pod = cluster.pod(name)
    return not pod["spec"].get("nodeName") and "AWS_NEURON_IDS" not in (
        pod["metadata"].get("annotations") or {}
    )


def refused_binds(cluster: ExtenderCluster) -> float:
    """``neuron_dra_extender_decisions_total{verb="bind",outcome="refused"}``, as scraped."""
    for line in cluster.metrics().splitlines():
        name, _, rest = line.partition("{")
        labels, _, value = rest.partition("} ")
        if name == "neuron_dra_extender_decisions_total" and set(labels.split(",")) == {
            'verb="bind"',
            'outcome="refused"',
        }:
            return float(value)
    return 0.0


def refused_at_handshake(
    cluster: ExtenderCluster, context: ssl.SSLContext, args: dict[str, Any]
) -> None:
    """Assert that the extender refuses the client ``context`` makes during the TLS
    handshake, in both versions, and answers none of its bind.

    In TLS 1.2 the client's handshake itself fails: the request is never sent. In TLS 1.3
    the client finishes its side of the handshake before the extender has checked its
    certificate; the extender then closes the connection, and the bind the client sent gets
    no answer: the client reads the extender's alert, or the end of the stream.
    """
    body = json.dumps(args).encode()
    request = (
        b"POST /bind HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    address = ("127.0.0.1", cluster.extender_port)
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    with socket.create_connection(address, timeout=10) as raw, pytest.raises(ssl.SSLError):
        context.wrap_socket(raw, server_hostname="127.0.0.1")
    context.maximum_version = ssl.TLSVersion.TLSv1_3
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    with (
        socket.create_connection(address, timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1", suppress_ragged_eofs=False) as c,
    ):
        c.sendall(request)
        try:
            answer = c.recv(65536)
        except (ssl.SSLError, ConnectionError):
            answer = b""  # the alert, or the connection cut
        assert answer == b"", f"the extender answered a client it should refuse: {answer!r}"


def test_a_client_without_a_certificate_is_refused_at_the_handshake(
    extender_cluster: ExtenderCluster,
) -> None:
    extender_cluster.apply(plain_pod("anonymous-target"))
    args = bind_args(extender_cluster, "anonymous-target")
    refused_at_handshake(extender_cluster, extender_cluster.anonymous_context(), args)
    assert unbound(extender_cluster, "anonymous-target")


def test_a_certificate_from_another_ca_is_refused_at_the_handshake(
    extender_cluster: ExtenderCluster,
) -> None:
    # What a hostile node holds: its kubelet's client certificate, from the cluster's CA.
    node_cert = Pki(extender_cluster.root / "pki").node("trn2-attack")
    extender_cluster.apply(plain_pod("foreign-target"))
    args = bind_args(extender_cluster, "foreign-target")
    refused_at_handshake(extender_cluster, extender_cluster.client_context(node_cert), args)
    assert unbound(extender_cluster, "foreign-target")


def test_the_schedulers_certificate_passes_the_same_handshake(
    extender_cluster: ExtenderCluster,
) -> None:
    # The check above, made with the scheduler's certificate, is answered: what refuses the
    # others is their certificate, not the way they connect.
    context = extender_cluster.client_context()
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    with (
        socket.create_connection(("127.0.0.1", extender_cluster.extender_port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as conn,
    ):
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: extender\r\n\r\n")
        assert conn.recv(65536).startswith(b"HTTP/1.1 200 ")


def test_plain_http_to_the_verbs_port_gets_no_answer(extender_cluster: ExtenderCluster) -> None:
    extender_cluster.apply(plain_pod("plaintext-target"))
    body = json.dumps(bind_args(extender_cluster, "plaintext-target")).encode()
    with socket.create_connection(("127.0.0.1", extender_cluster.extender_port), timeout=10) as c:
        c.sendall(
            b"POST /bind HTTP/1.1\r\nHost: extender\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body), body)
        )
        try:
            answer = c.recv(65536)
        except ConnectionResetError:
            answer = b""
    # Not HTTP: at most a TLS alert record (content type 21) before the connection closes.
    assert not answer.startswith(b"HTTP/"), answer[:100]
    assert unbound(extender_cluster, "plaintext-target")


def test_the_probes_port_serves_no_verb(extender_cluster: ExtenderCluster) -> None:
    extender_cluster.apply(plain_pod("probe-port-target"))
    request = urllib.request.Request(
        f"http://127.0.0.1:{extender_cluster.probe_port}/bind",
        data=json.dumps(bind_args(extender_cluster, "probe-port-target")).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    refused.value.close()
    assert refused.value.code in (404, 405)
    assert unbound(extender_cluster, "probe-port-target")


def test_the_schedulers_certificate_cannot_bind_a_pod_that_asks_for_no_neuron_resource(
    extender_cluster: ExtenderCluster,
) -> None:
    extender_cluster.apply(plain_pod("secret-holder"))
    before = refused_binds(extender_cluster)
    answer = extender_cluster.call("bind", bind_args(extender_cluster, "secret-holder"))
    assert answer["Error"] == (
        f"Pod {NAMESPACE}/secret-holder not bound to node trn2-attack: {NOT_MANAGED}"
    )
    assert unbound(extender_cluster, "secret-holder")
    assert refused_binds(extender_cluster) == before + 1


def test_a_filter_body_claiming_neuron_devices_does_not_make_a_plain_pod_bindable(
    extender_cluster: ExtenderCluster,
) -> None:
    # A caller with the certificate sends, as filter's Pod, the plain pod dressed up with a
    # Neuron request, then binds it: bind judges the pod as the API shows it, not as sent.
    extender_cluster.apply(plain_pod("dressed-up"))
    real = extender_cluster.pod("dressed-up")
    forged = {
        "metadata": real["metadata"],
        "spec": {
            "containers": [
                {"name": "main", "resources": {"limits": {"aws.amazon.com/neuron": "1"}}}
            ]
        },
    }
    offered = extender_cluster.call("filter", {"Pod": forged, "NodeNames": ["trn2-attack"]})
    assert offered["NodeNames"] == ["trn2-attack"]
    before = refused_binds(extender_cluster)
    answer = extender_cluster.call("bind", bind_args(extender_cluster, "dressed-up"))
    assert answer["Error"] == (
        f"Pod {NAMESPACE}/dressed-up not bound to node trn2-attack: {NOT_MANAGED}"
    )
    assert unbound(extender_cluster, "dressed-up")
    assert refused_binds(extender_cluster) == before + 1


def test_a_pod_asking_for_zero_neuron_devices_reads_why_in_its_failed_scheduling_event(
    extender_cluster: ExtenderCluster,
) -> None:
    # `aws.amazon.com/neuron: 0` names a managed resource, so the real scheduler calls the
    # extender for it (over mutual TLS), which places nothing for it.
    extender_cluster.apply(
        neuron_pod("zero", node="trn2-unmanaged", count=0, scheduler="my-scheduler")
    )

    def event() -> str:
        items = json.loads(
            extender_cluster.kubectl(
                "get",
                "events",
                "-n",
                NAMESPACE,
                "--field-selector",
                "involvedObject.name=zero,reason=FailedScheduling",
                "-o",
                "json",
            )
        )["items"]
        return next((e["message"] for e in items if NOT_MANAGED in e["message"]), "")

    message = extender_cluster.wait_for("the FailedScheduling event", event)
    assert f"1 node(s) were not offered: {NOT_MANAGED}" in message, message
    assert unbound(extender_cluster, "zero")


def _start(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "neuron_dra_scheduler_extender"],
        env={
            "PATH": "/usr/bin:/bin",
            "NEURON_DRA_KUBECONFIG": str(tmp_path / "no-such.kubeconfig"),
            "NEURON_DRA_HTTP_PORT": "0",
            "NEURON_DRA_VERBS_PORT": "0",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_missing_certificate_file_stops_the_start_naming_the_setting(
    extender_cluster: ExtenderCluster, tmp_path: Path
) -> None:
    tls = extender_cluster.tls
    proc = _start(
        {
            "NEURON_DRA_TLS_CERT": str(tmp_path / "gone.crt"),
            "NEURON_DRA_TLS_KEY": str(tls.server.key),
            "NEURON_DRA_TLS_CLIENT_CA": str(tls.ca),
        },
        tmp_path,
    )
    assert proc.returncode == 2
    [line] = [json.loads(x) for x in proc.stderr.splitlines() if "cannot start" in x]
    assert line["error"] == (
        f"NEURON_DRA_TLS_CERT (--tls-cert)='{tmp_path / 'gone.crt'}': No such file or directory"
    )
    # With no certificate settings at all, the start says what to set.
    proc = _start({}, tmp_path)
    assert proc.returncode == 2
    assert "NEURON_DRA_TLS_CERT (--tls-cert) is empty" in proc.stderr


def test_the_insecure_debugging_mode_says_so_at_start(
    extender_cluster: ExtenderCluster, tmp_path: Path
) -> None:
    proc = _start({"NEURON_DRA_VERBS_INSECURE_HTTP": "true"}, tmp_path)
    # It goes on to the API (here a kubeconfig that does not exist), after the warning.
    assert proc.returncode == 2
    warnings = [
        json.loads(x) for x in proc.stderr.splitlines() if x.startswith("{") and "INSECURE" in x
    ]
    [warning] = warnings
    assert warning["level"] == "warning"
    assert "anyone who reaches the port can bind" in warning["message"]


async def test_a_client_that_never_finishes_the_handshake_is_cut_off(tmp_path: Path) -> None:
    # The verbs' server as the extender builds it, with a short header deadline: a connection
    # that opens and sends nothing (or a TLS hello that never ends) is closed when it expires,
    # so handshakes cannot hold the server's sockets for ever.
    tls = extender_tls(tmp_path / "pki")
    context = server_context(
        ExtenderSettings(
            tls_cert=str(tls.server.cert), tls_key=str(tls.server.key), tls_client_ca=str(tls.ca)
        )
    )
    server = HealthServer(
        host="127.0.0.1", port=0, limits=HttpLimits(header_timeout=0.5), tls=context
    )
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"\x16\x03\x01")  # the first bytes of a TLS record, and no more
        started = time.monotonic()
        assert await asyncio.wait_for(reader.read(), timeout=10) == b""
        assert time.monotonic() - started < 5
        writer.close()
    finally:
        await server.stop()
