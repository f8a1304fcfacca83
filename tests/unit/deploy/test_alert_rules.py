"""The monitoring component's alerting rules, checked and unit-tested with promtool.

promtool comes from Debian's ``prometheus`` package, fetched once into the cache
(``neuron_dra_cli.toolbuild``; ``scripts/test.sh`` fetches it before the tests). The unit
tests (``monitoring/rules_test.yaml``) make each alert fire on the failure it names and stay
quiet without it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from neuron_dra_cli.toolbuild import ensure_promtool

HERE = Path(__file__).resolve().parent
RULE = (
    HERE.parents[2] / "deploy" / "kustomize" / "components" / "monitoring" / "prometheusrule.yaml"
)


@pytest.fixture(scope="module")
def promtool() -> Path:
    return ensure_promtool(progress=lambda _: None)


@pytest.fixture
def rules_dir(tmp_path: Path) -> Path:
    """The PrometheusRule's spec as a plain rules file, beside the promtool tests."""
    spec = yaml.safe_load(RULE.read_text())["spec"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    shutil.copy(HERE / "monitoring" / "rules_test.yaml", tmp_path / "rules_test.yaml")
    return tmp_path


def _promtool(promtool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def test_rules_are_valid(promtool: Path, rules_dir: Path) -> None:
    out = _promtool(promtool, "check", "rules", "rules.yaml", cwd=rules_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 7 rules found" in out.stdout


def test_each_alert_fires_on_its_failure_and_only_then(promtool: Path, rules_dir: Path) -> None:
    out = _promtool(promtool, "test", "rules", "rules_test.yaml", cwd=rules_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    tested = yaml.safe_load((rules_dir / "rules_test.yaml").read_text())["tests"]
    alerts = {
        r["alert"] for g in yaml.safe_load(RULE.read_text())["spec"]["groups"] for r in g["rules"]
    }
    fired = {
        case["alertname"]
        for test in tested
        for case in test.get("alert_rule_test", ())
        if case.get("exp_alerts")
    }
    quiet = {
        case["alertname"]
        for test in tested
        for case in test.get("alert_rule_test", ())
        if not case.get("exp_alerts")
    }
    assert fired == alerts
    assert quiet == alerts


def test_a_wrong_expectation_fails(promtool: Path, rules_dir: Path) -> None:
    # The promtool run above can fail: an alert expected where none fires is reported.
    broken = yaml.safe_load((rules_dir / "rules_test.yaml").read_text())
    case = broken["tests"][0]["alert_rule_test"][0]
    case["exp_alerts"] = [{"exp_labels": {"severity": "warning"}}]
    (rules_dir / "broken_test.yaml").write_text(yaml.safe_dump(broken, sort_keys=False))
    out = _promtool(promtool, "test", "rules", "broken_test.yaml", cwd=rules_dir)
    assert out.returncode != 0
    assert "NeuronDraDeadLetters" in out.stdout + out.stderr
