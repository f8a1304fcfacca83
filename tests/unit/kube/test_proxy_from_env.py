"""The Kubernetes client reads the environment's proxy once (HTTPS_PROXY, NO_PROXY, ...)."""

from __future__ import annotations

import base64

import pytest
from neuron_dra_common.kube.client import proxy_from_env

PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy")


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_no_proxy_variables_no_proxy() -> None:
    assert proxy_from_env("https://10.0.0.1:6443") == (None, {})


def test_the_schemes_proxy_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.local:3128")
    assert proxy_from_env("https://api.example:6443") == ("http://proxy.local:3128", {})
    assert proxy_from_env("http://api.example:8080") == (None, {})


def test_no_proxy_bypasses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.local:3128")
    monkeypatch.setenv("NO_PROXY", "api.example,10.0.0.0/8")
    assert proxy_from_env("https://api.example:6443") == (None, {})


def test_credentials_in_the_proxy_url_become_a_header(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://user%40corp:s3cret@proxy.local:3128")
    proxy, headers = proxy_from_env("https://api.example:6443")
    assert proxy == "http://proxy.local:3128"
    token = base64.b64encode(b"user@corp:s3cret").decode()
    assert headers == {"Proxy-Authorization": f"Basic {token}"}
