"""The verbs' TLS settings: a context that requires a client certificate, or one line naming
the setting that is wrong."""

from __future__ import annotations

import ssl
from pathlib import Path

import msgspec
import pytest
from neuron_dra_cli.stack.realdeviceplugin import extender_tls
from neuron_dra_common.settings import SettingsError
from neuron_dra_scheduler_extender.settings import ExtenderSettings
from neuron_dra_scheduler_extender.tls import server_context


def settings(tmp_path: Path, **override: str) -> ExtenderSettings:
    tls = extender_tls(tmp_path / "pki")
    files = {
        "tls_cert": str(tls.server.cert),
        "tls_key": str(tls.server.key),
        "tls_client_ca": str(tls.ca),
        **override,
    }
    return msgspec.convert(files, ExtenderSettings)


def test_the_context_requires_a_client_certificate(tmp_path: Path) -> None:
    context = server_context(settings(tmp_path))
    assert context is not None
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert [c["subject"] for c in context.get_ca_certs()] == [
        ((("commonName", "neuron-dra-local-ca"),),)
    ]


def test_a_key_that_is_not_the_certificates_names_both_settings(tmp_path: Path) -> None:
    other = extender_tls(tmp_path / "other")
    with pytest.raises(SettingsError) as refused:
        server_context(settings(tmp_path, tls_key=str(other.server.key)))
    message = str(refused.value)
    assert message.startswith("NEURON_DRA_TLS_CERT (--tls-cert)=")
    assert "NEURON_DRA_TLS_KEY (--tls-key)=" in message
    assert "not a PEM certificate and its key" in message
    assert "\n" not in message


def test_a_client_ca_file_without_a_certificate_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "ca.crt"
    empty.write_text("")
    with pytest.raises(SettingsError, match=r"^NEURON_DRA_TLS_CLIENT_CA \(--tls-client-ca\)="):
        server_context(settings(tmp_path, tls_client_ca=str(empty)))


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(
        SettingsError,
        match=r"^NEURON_DRA_TLS_KEY \(--tls-key\)='.*/nowhere.key': No such file or directory$",
    ):
        server_context(settings(tmp_path, tls_key=str(tmp_path / "nowhere.key")))


def test_the_insecure_mode_has_no_context_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert server_context(ExtenderSettings(verbs_insecure_http=True)) is None
    [record] = caplog.records
    assert record.levelname == "WARNING"
    assert record.getMessage().startswith("INSECURE: the extender verbs are served over plain HTTP")
