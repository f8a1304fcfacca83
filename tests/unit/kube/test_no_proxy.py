"""NO_PROXY as Go reads it (CIDRs, IPs, domains, ports, ``*``, loopback), and the environment
made to say the same to aiohttp, which reads it through urllib (no CIDRs)."""

from __future__ import annotations

import urllib.request

import pytest
from neuron_dra_common.kube.proxy import bypasses_proxy, honour_no_proxy


@pytest.mark.parametrize(
    ("host", "port", "no_proxy", "bypass"),
    [
        ("10.1.2.3", "6443", "10.0.0.0/8", True),
        ("10.1.2.3", "6443", "192.168.0.0/16", False),
        ("fd00::5", "443", "fd00::/64", True),
        ("fd00::5", "443", "10.0.0.0/8", False),
        ("10.1.2.3", "6443", "10.1.2.3", True),
        ("10.1.2.3", "6443", "10.1.2.3:6443", True),
        ("10.1.2.3", "6443", "10.1.2.3:443", False),
        ("api.example.com", "443", "example.com", True),
        ("example.com", "443", "example.com", True),
        ("example.com", "443", ".example.com", False),
        ("api.example.com", "443", ".example.com", True),
        ("api.example.com", "443", "*.example.com", True),
        ("notexample.com", "443", "example.com", False),
        ("api.example.com", "8443", "example.com:443", False),
        ("anything", "1", " * ", True),
        ("localhost", "6443", "", True),
        ("127.0.0.1", "6443", "", True),
        ("::1", "6443", "", True),
        ("api.example.com", "443", "", False),
        ("10.1.2.3", "6443", "not-a-cidr/99,,", False),
    ],
)
def test_go_rules(host: str, port: str, no_proxy: str, bypass: bool) -> None:
    assert bypasses_proxy(host, port, no_proxy) is bypass


def test_a_cidr_puts_the_servers_ip_in_the_environment() -> None:
    env = {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "example.com,10.0.0.0/8"}
    assert not urllib.request.proxy_bypass_environment("10.1.2.3", {"no": env["NO_PROXY"]})  # type: ignore[attr-defined]
    assert honour_no_proxy("https://10.1.2.3:6443", env)
    assert env["NO_PROXY"] == env["no_proxy"] == "example.com,10.0.0.0/8,10.1.2.3"
    assert urllib.request.proxy_bypass_environment("10.1.2.3", {"no": env["no_proxy"]})  # type: ignore[attr-defined]
    assert not honour_no_proxy("https://10.1.2.3:6443", env), "once is enough"


def test_the_environment_is_left_alone_otherwise() -> None:
    for env, server in (
        ({"NO_PROXY": "10.0.0.0/8"}, "https://10.1.2.3:6443"),  # no proxy at all
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.0.0.0/8"}, "https://api.example"),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "192.168.0.0/16"}, "https://10.1.2.3"),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.1.2.3"}, "https://10.1.2.3"),
    ):
        before = dict(env)
        assert not honour_no_proxy(server, env)
        assert env == before
