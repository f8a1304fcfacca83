"""The alert receiver of the local stack: one Alertmanager, and the audit and alerts services.

Alertmanager runs on a free loopback port with its data under ``state_dir/alertmanager``,
without clustering; its UI and API are at ``http://127.0.0.1:<web>/``. The alerts service
posts there; the audit service writes ``state_dir/audit/audit.jsonl``.
"""

from __future__ import annotations

from pathlib import Path

from neuron_dra_cli.stack import probes, process
from neuron_dra_cli.stack.components import Component, python_service

__all__ = ["ALERTMANAGER", "alertmanager", "audit_file", "subscriber_components", "ui_url"]

ALERTMANAGER = "alertmanager"

_CONFIG = """\
# Written by neuron-dra: every alert goes to one receiver with no integration; look at them
# in the UI or with GET /api/v2/alerts.
route:
  receiver: stack
  group_by: [alertname, node, workload]
  group_wait: 1s
  group_interval: 5s
  repeat_interval: 1h
receivers:
  - name: stack
"""


def alertmanager(*, binary: Path, state_dir: Path) -> Component:
    """Alertmanager on a free loopback port, its config and data under ``state_dir``."""
    port = process.free_port()
    root = state_dir / ALERTMANAGER
    (root / "data").mkdir(parents=True, exist_ok=True)
    config = root / "alertmanager.yml"
    config.write_text(_CONFIG)
    return Component(
        name=ALERTMANAGER,
        kind=ALERTMANAGER,
        argv=[
            str(binary),
            f"--config.file={config}",
            f"--storage.path={root / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ],
        ports={"web": port},
        ready=lambda: probes.http_ok(f"http://127.0.0.1:{port}/-/ready"),
    )


def ui_url(ports: dict[str, int]) -> str:
    """Alertmanager's UI (its API is under ``/api/v2``)."""
    return f"http://127.0.0.1:{ports['web']}/"


def audit_file(state_dir: Path) -> Path:
    return state_dir / "audit" / "audit.jsonl"


def subscriber_components(
    *, nats_url: str, state_dir: Path, alertmanager_url: str
) -> list[Component]:
    """The audit service (writing under ``state_dir/audit``) and the alerts service."""
    return [
        python_service(
            name="audit",
            kind="audit",
            module="neuron_dra_audit",
            env={
                "NEURON_DRA_NATS_SERVERS": nats_url,
                "NEURON_DRA_AUDIT_FILE": str(audit_file(state_dir)),
                # The file is what the stack keeps; the log would hold the same lines again.
                "NEURON_DRA_STDOUT": "false",
            },
            ready_path="/readyz",
        ),
        python_service(
            name="alerts",
            kind="alerts",
            module="neuron_dra_alerts",
            env={
                "NEURON_DRA_NATS_SERVERS": nats_url,
                "NEURON_DRA_ALERTMANAGER_URL": alertmanager_url,
                "NEURON_DRA_RESEND_SECONDS": "30",
                "NEURON_DRA_ALERT_TTL_SECONDS": "120",
            },
            ready_path="/readyz",
        ),
    ]
