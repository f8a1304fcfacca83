"""The simulated nodes run the real kubelet code: a DRA kubelet plugin (the upstream test
driver, built at the same pin) registers with a node's kubelet, which prepares a pod's
claim, runs the pod, and unprepares the claim when the pod is deleted. (The same on the
oldest supported release: tests/e2e/floor.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.upstream_driver import run_claim_lifecycle
from tests.fixtures.stack import KubeStack


@pytest.mark.stack
def test_pod_with_claim_runs_and_frees_on_the_default_release(
    kube_stack: KubeStack, tmp_path: Path
) -> None:
    run_claim_lifecycle(kube_stack, tmp_path)
