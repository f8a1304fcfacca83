"""Where the trace backend comes from and how the stack runs it."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import yaml
from neuron_dra_cli.dev import summary
from neuron_dra_cli.main import build_parser
from neuron_dra_cli.stack import tracing
from neuron_dra_cli.stack.state import ComponentState, StackState
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


def test_dev_up_prints_the_traces_ui_only_when_jaeger_runs(tmp_path: Path) -> None:
    base = StackState(
        k8s_version="1.36.3",
        fleet="fleet.yaml",
        kubeconfig="kubeconfig",
        apiserver="https://127.0.0.1:6443",
        nats_url="nats://127.0.0.1:4222",
    )
    without = summary(base, state_dir=tmp_path, seconds=1.0, detached=True)
    assert "traces UI" not in without
    jaeger = ComponentState(
        name="jaeger", kind="jaeger", pid=1, start_ticks=1, log="j.log", ports={"ui": 16686}
    )
    with_jaeger = msgspec.structs.replace(base, components=(jaeger,))
    text = summary(with_jaeger, state_dir=tmp_path, seconds=1.0, detached=True)
    assert "  traces UI    http://127.0.0.1:16686/" in text.splitlines()


def test_dev_up_takes_tracing() -> None:
    args = build_parser().parse_args(["dev", "up", "--tracing"])
    assert args.tracing is True
    assert build_parser().parse_args(["dev", "up"]).tracing is False


def test_alertmanager_is_pinned_and_the_stack_runs_it_on_loopback(tmp_path: Path) -> None:
    from neuron_dra_cli.stack import alerting
    from neuron_dra_cli.toolbuild import ALERTMANAGER, ALERTMANAGER_PACKAGE

    version = ALERTMANAGER.version(REPO / "tools" / "alertmanager")
    sums = (REPO / "tools" / "alertmanager" / "go.sum").read_text()
    assert f"github.com/prometheus/alertmanager {version} h1:" in sums
    assert (
        f'_ "{ALERTMANAGER_PACKAGE}"' in (REPO / "tools" / "alertmanager" / "tools.go").read_text()
    )
    component = alerting.alertmanager(binary=Path("/bin/true"), state_dir=tmp_path)
    port = component.ports["web"]
    assert f"--web.listen-address=127.0.0.1:{port}" in component.argv
    assert "--cluster.listen-address=" in component.argv  # no gossip port on the network
    assert yaml.safe_load((tmp_path / "alertmanager" / "alertmanager.yml").read_text())["route"]


def test_dev_up_prints_the_alerts_ui_and_the_audit_log(tmp_path: Path) -> None:
    base = StackState(
        k8s_version="1.36.3",
        fleet="fleet.yaml",
        kubeconfig="kubeconfig",
        apiserver="https://127.0.0.1:6443",
        nats_url="nats://127.0.0.1:4222",
    )
    am = ComponentState(
        name="alertmanager",
        kind="alertmanager",
        pid=1,
        start_ticks=1,
        log="a.log",
        ports={"web": 9093},
    )
    audit = ComponentState(name="audit", kind="audit", pid=2, start_ticks=1, log="b.log")
    text = summary(
        msgspec.structs.replace(base, components=(am, audit)),
        state_dir=tmp_path,
        seconds=1.0,
        detached=True,
    )
    assert "  alerts UI    http://127.0.0.1:9093/   (Alertmanager; API under /api/v2)" in text
    assert f"  audit log    {tmp_path / 'audit' / 'audit.jsonl'}" in text
