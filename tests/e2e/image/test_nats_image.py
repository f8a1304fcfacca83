"""The NATS image the ``local`` overlay names (``localhost/nats:<version>``), built from the
pinned nats-server and run with a real engine as the StatefulSet runs it: the base's
``nats.conf``, a non-root user, a read-only root filesystem, JetStream on its volume, the
preStop hook's lame duck signal, and a clean exit."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request
from pathlib import Path

import nats
import pytest

from tests.fixtures.image import Container, podman, run_container
from tests.fixtures.stack import REPO

pytestmark = [pytest.mark.image, pytest.mark.timeout(600)]

CONF = REPO / "deploy" / "kustomize" / "base" / "nats" / "nats.conf"


@pytest.fixture(scope="module")
def nats_image(image: str) -> str:
    """``image`` first: it skips (or fails in CI) without an engine, and makes the base."""
    from neuron_dra_cli import natsimage

    return natsimage.ensure_nats_image(progress=lambda m: print(m, file=sys.stderr))


def start(nats_image: str, data: Path) -> tuple[Container, int]:
    from neuron_dra_cli.stack.process import free_port

    client, monitor = free_port(), free_port()
    data.chmod(0o777)
    # The StatefulSet's own arguments and config; the ports moved off the fixed ones so the
    # host network has room for other servers.
    container = run_container(
        nats_image,
        ["--config", "/etc/nats/nats.conf", "--port", str(client), "--http_port", str(monitor)],
        env={"POD_NAME": "nats-0"},
        volumes=[f"{CONF}:/etc/nats/nats.conf:ro", f"{data}:/data"],
        prefix="neuron-dra-nats",
    )
    container.http_port = monitor
    return container, client


async def round_trip(client: int) -> int:
    nc = await nats.connect(f"nats://127.0.0.1:{client}", connect_timeout=5)
    try:
        js = nc.jetstream()
        await js.add_stream(name="IMAGE", subjects=["image.>"])
        await js.publish("image.test", b"kept")
        info = await js.stream_info("IMAGE")
        return int(info.state.messages)
    finally:
        await nc.close()


def test_nats_image_runs_the_statefulsets_config_with_jetstream(
    nats_image: str, tmp_path: Path
) -> None:
    from neuron_dra_cli import natsimage

    assert nats_image == f"localhost/nats:{natsimage.nats_server_version()}"
    assert nats_image == "localhost/nats:2.14.6"  # the tag the local overlay names
    container, client = start(nats_image, tmp_path)
    try:
        for _ in range(60):
            if "Server is ready" in container.logs():
                break
            assert container.running(), container.logs()
            time.sleep(0.5)
        container.wait_http("/healthz?js-enabled-only=true", timeout=60)
        with urllib.request.urlopen(container.url("/varz"), timeout=5) as resp:
            varz = json.load(resp)
        assert varz["server_name"] == "nats-0"  # $POD_NAME from the environment
        assert varz["version"] == "2.14.6"
        assert asyncio.run(round_trip(client)) == 1
        uid = podman("exec", container.name, "id", "-u").stdout.strip()
        assert uid == "65532"
        # JetStream's files are on the volume, written by the non-root user.
        stored = [p for p in tmp_path.rglob("*") if p.is_file()]
        assert stored
        assert {p.stat().st_uid for p in stored} == {65532}
        # The StatefulSet's preStop hook, as written there: lame duck mode on pid 1.
        hook = podman("exec", container.name, "sh", "-c", "nats-server --signal ldm=1", check=False)
        # With no client left the server stops as soon as it enters lame duck mode, and podman
        # kills an exec session whose container has stopped (137): the hook did its work then
        # too, which the server's log and its exit code below show.
        assert hook.returncode == 0 or (hook.returncode == 137 and not container.running()), (
            hook.returncode,
            hook.stderr,
        )
        for _ in range(20):
            if "Entering lame duck mode" in container.logs():
                break
            time.sleep(0.5)
        assert "Entering lame duck mode" in container.logs()
    finally:
        code = container.terminate(grace=45)
        logs = container.logs()
        container.remove()
    assert code == 0, logs


def test_an_unchanged_nats_image_is_not_built_again(nats_image: str) -> None:
    from neuron_dra_cli import natsimage

    messages: list[str] = []
    assert natsimage.ensure_nats_image(progress=messages.append) == nats_image
    assert not any("building" in m for m in messages), messages
