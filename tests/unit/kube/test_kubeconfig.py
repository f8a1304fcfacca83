"""Reading kubeconfigs and the pod's service account through kubernetes-asyncio's loaders:
the kubeconfigs the local stack writes (certificates from its own PKI), their inline and
token variants, and the errors a user sees for a file that cannot be used."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest
import uvloop
import yaml
from neuron_dra_cli.stack.pki import CertPair, Pki, write_kubeconfig
from neuron_dra_common.kube import (
    ConfigError,
    KubeClient,
    KubeConfig,
    load_in_cluster,
    load_kubeconfig,
)

SERVER = "https://127.0.0.1:6443"


async def bearer(config: KubeConfig) -> str | None:
    """The Authorization header the library would send now."""
    token: str | None = await config.configuration.get_api_key_with_prefix("BearerToken")
    return token


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Pki, CertPair]:
    pki = Pki(tmp_path_factory.mktemp("pki"))
    return pki, pki.client("admin", user="kubernetes-admin", groups=("system:masters",))


@pytest.fixture
def stack_kubeconfig(tmp_path: Path, pki: tuple[Pki, CertPair]) -> Path:
    """The admin kubeconfig exactly as ``neuron-dra dev up`` writes it."""
    ca, pair = pki
    return write_kubeconfig(
        tmp_path / "kubeconfig", server=SERVER, ca=ca.ca.cert, pair=pair, user="kubernetes-admin"
    )


def rewrite(path: Path, change: Any) -> Path:
    doc = yaml.safe_load(path.read_text())
    change(doc)
    path.write_text(yaml.safe_dump(doc))
    return path


def same_file(named: str | None, path: Path) -> bool:
    assert named is not None
    return Path(named).resolve() == path.resolve()


def same_bytes(named: str | None, path: Path) -> bool:
    assert named is not None
    return Path(named).read_bytes() == path.read_bytes()


def read_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def user_of(doc: dict[str, Any]) -> dict[str, Any]:
    user: dict[str, Any] = doc["users"][0]["user"]
    return user


def cluster_of(doc: dict[str, Any]) -> dict[str, Any]:
    cluster: dict[str, Any] = doc["clusters"][0]["cluster"]
    return cluster


async def test_the_stacks_kubeconfig_gives_its_server_ca_and_client_certificate(
    stack_kubeconfig: Path, pki: tuple[Pki, CertPair]
) -> None:
    ca, pair = pki
    config = await load_kubeconfig(stack_kubeconfig)
    c = config.configuration
    assert config.server == SERVER
    assert same_file(c.ssl_ca_cert, ca.ca.cert)
    assert same_file(c.cert_file, pair.cert)
    assert same_file(c.key_file, pair.key)
    assert c.verify_ssl
    assert await bearer(config) is None


async def test_inline_data_is_the_same_as_the_files(
    stack_kubeconfig: Path, pki: tuple[Pki, CertPair]
) -> None:
    ca, pair = pki

    def inline(doc: dict[str, Any]) -> None:
        cluster, user = cluster_of(doc), user_of(doc)
        del cluster["certificate-authority"], user["client-certificate"], user["client-key"]
        cluster["certificate-authority-data"] = base64.b64encode(ca.ca.cert.read_bytes()).decode()
        user["client-certificate-data"] = base64.b64encode(pair.cert.read_bytes()).decode()
        user["client-key-data"] = base64.b64encode(pair.key.read_bytes()).decode()

    config = await load_kubeconfig(rewrite(stack_kubeconfig, inline))
    c = config.configuration
    assert same_bytes(c.ssl_ca_cert, ca.ca.cert)
    assert same_bytes(c.cert_file, pair.cert)
    assert same_bytes(c.key_file, pair.key)
    client = KubeClient(config)  # the TLS context is built from them
    await client.close()


async def test_relative_paths_are_relative_to_the_kubeconfig(
    tmp_path: Path, pki: tuple[Pki, CertPair]
) -> None:
    ca, pair = pki
    here = tmp_path / "conf"
    here.mkdir()
    for src, name in ((ca.ca.cert, "ca.crt"), (pair.cert, "c.crt"), (pair.key, "c.key")):
        (here / name).write_bytes(src.read_bytes())
    path = write_kubeconfig(here / "config", server=SERVER, ca=ca.ca.cert, pair=pair, user="u")

    def relative(doc: dict[str, Any]) -> None:
        cluster_of(doc)["certificate-authority"] = "ca.crt"
        user_of(doc).update({"client-certificate": "c.crt", "client-key": "c.key"})

    config = await load_kubeconfig(rewrite(path, relative))
    assert config.ca_file == str(here / "ca.crt")
    assert config.configuration.cert_file == str(here / "c.crt")


async def test_token_and_token_file(tmp_path: Path, stack_kubeconfig: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")

    def token(doc: dict[str, Any]) -> None:
        doc["users"][0]["user"] = {"token": "abc"}

    config = await load_kubeconfig(rewrite(stack_kubeconfig, token))
    assert await bearer(config) == "Bearer abc"

    def token_file_only(doc: dict[str, Any]) -> None:
        doc["users"][0]["user"] = {"tokenFile": str(token_file)}

    config = await load_kubeconfig(rewrite(stack_kubeconfig, token_file_only))
    assert await bearer(config) == "Bearer from-file"
    token_file.write_text("rotated")
    config.expire_token()  # as after a 401
    assert await bearer(config) == "Bearer rotated"


async def test_exec_plugin_token(tmp_path: Path, stack_kubeconfig: Path) -> None:
    plugin = tmp_path / "get-token"
    plugin.write_text(
        "#!/bin/sh\n"
        'echo "{\\"apiVersion\\": \\"client.authentication.k8s.io/v1\\", '
        '\\"kind\\": \\"ExecCredential\\", \\"status\\": {\\"token\\": \\"$WHO\\"}}"\n'
    )
    plugin.chmod(0o755)

    def exec_user(doc: dict[str, Any]) -> None:
        doc["users"][0]["user"] = {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": str(plugin),
                "env": [{"name": "WHO", "value": "plugin-token"}],
            }
        }

    config = await load_kubeconfig(rewrite(stack_kubeconfig, exec_user))
    assert await bearer(config) == "Bearer plugin-token"
    assert config.loader is not None  # kept to run the plugin again


async def test_a_plugin_that_hangs_at_start_is_a_start_error(
    tmp_path: Path, stack_kubeconfig: Path
) -> None:
    pid_file = tmp_path / "pid"
    plugin = tmp_path / "hang"
    plugin.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 600\n")
    plugin.chmod(0o755)

    def exec_user(doc: dict[str, Any]) -> None:
        doc["users"][0]["user"] = {
            "exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin)}
        }

    with pytest.raises(ConfigError, match="no answer in 1 s; killed") as caught:
        await load_kubeconfig(rewrite(stack_kubeconfig, exec_user), exec_timeout=1)
    assert "\n" not in str(caught.value)
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_hung_plugin_is_killed_under_uvloop_too(tmp_path: Path, stack_kubeconfig: Path) -> None:
    # The services run on uvloop, whose subprocess transport differs from asyncio's.
    pid_file = tmp_path / "pid"
    plugin = tmp_path / "hang"
    plugin.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 600\n")
    plugin.chmod(0o755)

    def exec_user(doc: dict[str, Any]) -> None:
        doc["users"][0]["user"] = {
            "exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin)}
        }

    path = rewrite(stack_kubeconfig, exec_user)

    async def load() -> None:
        await load_kubeconfig(path, exec_timeout=1)

    with pytest.raises(ConfigError, match="no answer in 1 s; killed"):
        uvloop.run(load())
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


async def test_context_by_name_and_several_files(tmp_path: Path, stack_kubeconfig: Path) -> None:
    other = tmp_path / "other"
    other.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "far", "cluster": {"server": "https://far:443/"}}],
                "users": [{"name": "t", "user": {"token": "x"}}],
                "contexts": [{"name": "far", "context": {"cluster": "far", "user": "t"}}],
                "current-context": "far",
            }
        )
    )
    both = f"{stack_kubeconfig}:{other}"
    assert (await load_kubeconfig(both)).server == SERVER, "the first current-context counts"
    far = await load_kubeconfig(both, context="far")
    assert far.server == "https://far:443"
    assert await bearer(far) == "Bearer x"
    missing = tmp_path / "missing"
    assert (await load_kubeconfig(f"{missing}:{other}")).server == "https://far:443"


async def test_in_cluster_reads_the_service_account(
    tmp_path: Path, pki: tuple[Pki, CertPair]
) -> None:
    ca, _ = pki
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_bytes(ca.ca.cert.read_bytes())
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    config = load_in_cluster(env=env, account_dir=tmp_path)
    assert config.server == "https://10.0.0.1:443"
    assert config.ca_file == str(tmp_path / "ca.crt")
    assert await bearer(config) == "Bearer sa-token"
    v6 = load_in_cluster(env={**env, "KUBERNETES_SERVICE_HOST": "fd00::1"}, account_dir=tmp_path)
    assert v6.server == "https://[fd00::1]:443"


def test_in_cluster_errors_say_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT"):
        load_in_cluster(env={"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, account_dir=tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(ConfigError, match=f"{tmp_path}/token does not exist"):
        load_in_cluster(env=env, account_dir=tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("current-context"), "current-context is not set"),
        (
            lambda d: d.update({"current-context": "nope"}),
            "context 'nope' is not in contexts",
        ),
        (
            lambda d: d["contexts"][0]["context"].update({"cluster": "gone"}),
            "names cluster 'gone', which is not in clusters",
        ),
        (
            lambda d: cluster_of(d).pop("server"),
            r"clusters\['neuron-dra'\].cluster.server is missing",
        ),
        (
            lambda d: cluster_of(d).update({"certificate-authority": "/no/ca.crt"}),
            r"clusters\['neuron-dra'\].cluster.certificate-authority: /no/ca.crt does not exist",
        ),
        (
            lambda d: cluster_of(d).update({"certificate-authority-data": "not base64!"}),
            "certificate-authority-data is not base64",
        ),
        (
            lambda d: cluster_of(d).update({"insecure-skip-tls-verify": "yes"}),
            "insecure-skip-tls-verify is 'yes', not true or false",
        ),
        (
            # The library would read the string as "skip verification".
            lambda d: cluster_of(d).update({"insecure-skip-tls-verify": "false"}),
            "insecure-skip-tls-verify is 'false', not true or false",
        ),
        (
            lambda d: user_of(d).pop("client-key"),
            r"users\['kubernetes-admin'\].user.client-key\(-data\) is missing",
        ),
        (
            lambda d: user_of(d).update({"auth-provider": {"name": "oidc"}}),
            "oidc: missing configuration",
        ),
        (lambda d: user_of(d).update({"exec": {"args": []}}), "exec.command is missing"),
    ],
)
async def test_errors_name_the_file_and_field(
    stack_kubeconfig: Path, change: Any, message: str
) -> None:
    rewrite(stack_kubeconfig, change)
    with pytest.raises(ConfigError, match=message) as caught:
        await load_kubeconfig(stack_kubeconfig)
    assert str(stack_kubeconfig) in str(caught.value)
    assert "\n" not in str(caught.value)


async def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"kubeconfig {tmp_path}/none: no such file"):
        await load_kubeconfig(tmp_path / "none")
    bad = tmp_path / "bad"
    bad.write_text("clusters: [unclosed")
    with pytest.raises(ConfigError, match=f"kubeconfig {bad}: not valid YAML"):
        await load_kubeconfig(bad)
    bad.write_text('{"clusters": [}')
    with pytest.raises(ConfigError, match=f"kubeconfig {bad}: not valid YAML"):
        await load_kubeconfig(bad)


async def test_a_server_that_is_not_a_url_is_refused(stack_kubeconfig: Path) -> None:
    rewrite(stack_kubeconfig, lambda d: cluster_of(d).update({"server": "127.0.0.1:6443"}))
    with pytest.raises(
        ConfigError, match=r"server is '127\.0\.0\.1:6443': not an https:// or http:// URL"
    ):
        await load_kubeconfig(stack_kubeconfig)


def _view(config: KubeConfig) -> tuple[Any, ...]:
    c = config.configuration
    return (c.host, c.ssl_ca_cert, c.cert_file, c.key_file, c.verify_ssl, c.proxy)


async def test_yaml_in_flow_style_and_json_are_read_alike(
    tmp_path: Path, stack_kubeconfig: Path
) -> None:
    doc = read_yaml(stack_kubeconfig)
    flow = tmp_path / "flow"
    flow.write_text(yaml.safe_dump(doc, default_flow_style=True))
    commented = tmp_path / "commented"
    commented.write_text(json.dumps(doc) + "\n# written by hand\n")
    as_json = tmp_path / "config.json"
    as_json.write_text(json.dumps(doc, indent=2))
    expected = _view(await load_kubeconfig(stack_kubeconfig))
    for path in (flow, commented, as_json):
        assert path.read_text().startswith("{")
        assert _view(await load_kubeconfig(path)) == expected


async def test_insecure_skips_verification(stack_kubeconfig: Path) -> None:
    def insecure(doc: dict[str, Any]) -> None:
        cluster_of(doc).pop("certificate-authority")
        cluster_of(doc)["insecure-skip-tls-verify"] = True

    config = await load_kubeconfig(rewrite(stack_kubeconfig, insecure))
    assert config.configuration.verify_ssl is False


async def test_a_client_is_made_without_network(stack_kubeconfig: Path) -> None:
    client = KubeClient(await load_kubeconfig(stack_kubeconfig))
    assert client.server == SERVER
    await client.close()
