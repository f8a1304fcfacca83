"""What a bus client sends to prove who it is, read from its files."""

from __future__ import annotations

from pathlib import Path

import pytest
from neuron_dra_common.bus import BusCredentials


def test_the_token_is_read_again_each_time(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    credentials = BusCredentials(token_file=str(token))
    assert credentials.token() == "first"
    token.write_text("rotated")
    assert credentials.token() == "rotated"


def test_a_missing_or_empty_token_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=f"NATS token file {tmp_path}/absent: No such file"):
        BusCredentials(token_file=str(tmp_path / "absent")).token()
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(RuntimeError, match="empty"):
        BusCredentials(token_file=str(tmp_path / "empty")).token()


def test_no_tls_without_a_ca_or_certificate() -> None:
    assert BusCredentials().tls() is None
