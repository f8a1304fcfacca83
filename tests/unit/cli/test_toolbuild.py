"""Where the trace backend comes from and how the stack runs it."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from neuron_dra_cli.stack import tracing
from neuron_dra_cli.toolbuild import JAEGER_PACKAGE, jaeger_module_version

REPO = Path(__file__).resolve().parents[3]


def test_jaeger_is_pinned_by_version_and_checksum() -> None:
    version = jaeger_module_version(REPO / "tools" / "jaeger")
    assert re.fullmatch(r"v1\.\d+\.\d+", version)
    sums = (REPO / "tools" / "jaeger" / "go.sum").read_text()
    assert f"github.com/jaegertracing/jaeger {version} h1:" in sums
    tools = (REPO / "tools" / "jaeger" / "tools.go").read_text()
    assert f'_ "{JAEGER_PACKAGE}"' in tools


def test_the_stacks_jaeger_listens_on_loopback_only(tmp_path: Path) -> None:
    component = tracing.jaeger(binary=Path("/bin/true"), state_dir=tmp_path)
    config = yaml.safe_load((tmp_path / "jaeger" / "config.yaml").read_text())
    endpoints = [
        config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"],
        config["receivers"]["otlp"]["protocols"]["http"]["endpoint"],
        config["extensions"]["jaeger_query"]["http"]["endpoint"],
        config["extensions"]["jaeger_query"]["grpc"]["endpoint"],
        config["extensions"]["healthcheckv2"]["http"]["endpoint"],
    ]
    assert all(e.startswith("127.0.0.1:") for e in endpoints)
    assert sorted(int(e.rsplit(":", 1)[1]) for e in endpoints) == sorted(component.ports.values())
    env = tracing.otlp_env(component.ports)
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == (
        f"http://127.0.0.1:{component.ports['otlp_grpc']}"
    )
    assert tracing.ui_url(component.ports) == f"http://127.0.0.1:{component.ports['ui']}/"
