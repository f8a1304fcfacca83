"""The alerts service's settings; every field also reads ``NEURON_DRA_<FIELD>``
(e.g. ``NEURON_DRA_ALERTMANAGER_URL``)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from neuron_dra_common.settings import ServiceSettings

__all__ = ["AlertsSettings"]


class AlertsSettings(ServiceSettings, frozen=True, kw_only=True):
    """Posts alerts for device faults, lost nodes and degraded workloads to Alertmanager."""

    alertmanager_url: Annotated[
        str,
        msgspec.Meta(
            pattern=r"^https?://",
            description="Alertmanager's base URL (alerts go to <url>/api/v2/alerts)",
        ),
    ] = "http://alertmanager:9093"
    resend_seconds: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="Seconds between re-sends of every firing alert (Alertmanager resolves "
            "an alert that is not re-sent before its end time)",
        ),
    ] = 60.0
    alert_ttl_seconds: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="How far ahead of each send a firing alert's endsAt is set; keep it a "
            "few re-sends long so one missed send does not resolve it",
        ),
    ] = 300.0
    request_timeout: Annotated[
        float, msgspec.Meta(gt=0, description="Seconds allowed for one Alertmanager request")
    ] = 10.0
    generator_url: Annotated[
        str, msgspec.Meta(description="generatorURL of every alert (a dashboard); empty: none")
    ] = ""
    deadletter_check_seconds: Annotated[
        float,
        msgspec.Meta(
            ge=0, description="Seconds between checks of the dead-letter stream; 0: no check"
        ),
    ] = 30.0
    deadletter_quiet_seconds: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="The dead-letter alert resolves once no message was dead-lettered for "
            "this long",
        ),
    ] = 900.0

    def __post_init__(self) -> None:
        if self.alert_ttl_seconds <= self.resend_seconds:
            raise msgspec.ValidationError(
                f"Expected `number` > resend_seconds ({self.resend_seconds:g}) - at "
                "`$.alert_ttl_seconds`"
            )
