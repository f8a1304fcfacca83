"""EFA for workloads of more than one UltraServer: the ``EFAReady`` condition.

AWS's UltraServer operator guide: "For workloads that span multiple UltraServers
(``serverCount`` > 1), the EFA DRA driver must be installed", and the user creates
``efa-claim-template`` (DeviceClass ``efa.networking.k8s.aws``, ``allocationMode: All``) and
attaches it to each pod beside the Neuron claim. The guide has the user write that template,
so the operator's generated template stays the Neuron request the guide shows (a drop-in
with AWS's). What the operator adds is the check: on a workload with ``serverCount`` > 1 it
looks for the EFA DeviceClass each pass and shows the answer as the condition ``EFAReady``
(and a Warning Event ``EFADriverNotInstalled`` when it is missing), so pods that would wait
for a DeviceClass that does not exist are explained on the workload instead of hanging
silently. Single-UltraServer workloads use NeuronLink only and get no such condition.

The condition is written with a field manager of its own, so the status the decider writes
(which owns the other conditions) never removes it.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from neuron_dra_common.efa import EFA_DEVICE_CLASS
from neuron_dra_common.kube import UNANSWERED, ApiException, KubeClient, apply_status

from neuron_dra_ultraserver_operator.model import FIELD_MANAGER, Workload
from neuron_dra_ultraserver_operator.resources import DEVICE_CLASSES, NUSW

__all__ = ["CONDITION", "EfaCheck", "efa_condition"]

log = logging.getLogger(__name__)

CONDITION: Final = "EFAReady"
MISSING: Final = "EFADriverNotInstalled"
_MANAGER: Final = f"{FIELD_MANAGER}-efa"
#: Seconds until a workload without EFA is looked at again (the driver may be installed).
RECHECK_SECONDS: Final = 15.0

Obj = dict[str, Any]


def efa_condition(workload: Workload, *, installed: bool, now: str) -> Obj:
    """The ``EFAReady`` condition of a workload of more than one UltraServer.

    >>> from neuron_dra_ultraserver_operator.model import workload_from_api
    >>> wl = workload_from_api({"metadata": {"name": "w", "namespace": "d", "generation": 1},
    ...     "spec": {"instanceType": "trn2u.48xlarge", "topologySize": 4, "serverCount": 2}})
    >>> efa_condition(wl, installed=False, now="2026-01-01T00:00:00Z")["reason"]
    'EFADriverNotInstalled'
    """
    if installed:
        reason = "EFADriverInstalled"
        message = (
            f"DeviceClass {EFA_DEVICE_CLASS} exists: attach an EFA claim (efa-claim-template) "
            "beside the Neuron claim of each pod"
        )
    else:
        reason = MISSING
        message = (
            f"spec.serverCount {workload.spec.server_count} spans UltraServers, which needs "
            f"the EFA DRA driver, and DeviceClass {EFA_DEVICE_CLASS} does not exist: install "
            "the EFA DRA driver (helm install aws-dranet eks/aws-dranet); pods asking for "
            "EFA stay Pending until then"
        )
    status = "True" if installed else "False"
    since = now
    for cond in workload.reported.get("conditions") or ():
        if cond.get("type") == CONDITION and cond.get("status") == status:
            since = str(cond.get("lastTransitionTime") or now)
    return {
        "type": CONDITION,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
        "observedGeneration": workload.metadata.generation,
    }


class EfaCheck:
    """Looks for the EFA DeviceClass for workloads of more than one UltraServer."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    async def installed(self) -> bool | None:
        """Whether the DeviceClass exists; ``None`` when the API did not say (no grant to
        read it, an error): the check is advice and never holds a reconcile up."""
        try:
            await self._client.get(DEVICE_CLASSES, EFA_DEVICE_CLASS)
        except ApiException as exc:
            if exc.status == 404:
                return False
            log.warning(
                f"cannot tell whether DeviceClass {EFA_DEVICE_CLASS} exists",
                extra={"status": exc.status, "error": str(exc)},
            )
            return None
        except UNANSWERED as exc:
            log.warning(
                f"cannot tell whether DeviceClass {EFA_DEVICE_CLASS} exists",
                extra={"error": repr(exc)},
            )
            return None
        return True

    async def check(self, workload: Workload, *, now: str) -> bool | None:
        """Write the workload's ``EFAReady`` condition when it changes (with an Event when
        EFA is missing); return whether EFA is installed, ``None`` for a workload that does
        not need it or when the API did not say."""
        if workload.spec.server_count <= 1 or workload.metadata.deletion_timestamp:
            return None
        installed = await self.installed()
        if installed is None:
            return None
        cond = efa_condition(workload, installed=installed, now=now)
        shown = [c for c in workload.reported.get("conditions") or () if c.get("type") == CONDITION]
        if shown and all(shown[0].get(k) == cond[k] for k in ("status", "reason", "message")):
            return installed
        body = {
            "metadata": {"name": workload.metadata.name, "namespace": workload.metadata.namespace},
            "status": {"conditions": [cond]},
        }
        try:
            await apply_status(self._client, NUSW, body, field_manager=_MANAGER)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return installed
        if not installed:
            log.warning(cond["message"], extra={"workload": workload.key})
            try:
                await self._client.post_event(
                    {
                        "apiVersion": NUSW.api_version,
                        "kind": NUSW.kind,
                        "name": workload.metadata.name,
                        "namespace": workload.metadata.namespace,
                        "uid": workload.metadata.uid,
                    },
                    reason=MISSING,
                    message=cond["message"],
                    component=FIELD_MANAGER,
                    warning=True,
                )
            except (ApiException, ValueError) as exc:
                log.warning(
                    "event not recorded", extra={"workload": workload.key, "error": str(exc)}
                )
        return installed
