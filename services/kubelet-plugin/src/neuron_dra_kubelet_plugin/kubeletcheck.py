"""The kubelet version check: AWS supports its Neuron DRA driver on no node whose kubelet is
1.34.0 or 1.34.1, because of a DRA regression in those two releases (kubernetes#133920,
fixed in 1.34.2).

What goes wrong there: 1.34 made the kubelet follow its gRPC connection to each DRA driver
(so that it notices a driver going away and comes back). gRPC puts a connection that carried
no call for 30 minutes to sleep, and tells the kubelet, which asks for a reconnect from
inside that very notification; in 1.34.0 and 1.34.1 that call waits for a lock gRPC already
holds. The connection is then stuck for good: every later ``NodePrepareResources`` and
``NodeUnprepareResources`` on it hangs until it times out, so new pods wait in
ContainerCreating and deleted ones in Terminating, until the kubelet is restarted. 1.34.2
reconnects from another goroutine (kubernetes#133926, in 1.34 as #133934).

On such a node the plugin says so once per kubelet version: a log line, a Warning Event
``KubeletDRARegression`` on the Node, and the Node's ``NeuronHealth`` condition (``True``,
reason ``KubeletDRARegression``); and unless ``allow_kubelet_dra_regression`` is set it
prepares no claim there: each one fails with a message ``kubectl describe pod`` shows in the
kubelet's ``FailedPrepareDynamicResources`` Event and in the plugin's own ``FailedPrepare``
Event on the pod. Unprepare always runs. The Node is read again every minute, so an
upgraded kubelet is served without restarting the plugin.

``NeuronHealth`` has two writers, the health probe (device errors, ``NeuronHasError_<TYPE>``;
``NeuronHasNoError`` when there is none) and this check. Neither overwrites the other's
problem with "no problem": the probe leaves a ``True`` condition whose reason is not its own
when it has no device error, and this check never writes over a device error (the Event and
the log still tell about the kubelet); it puts its reason back once the probe reports no
error again, and clears it (``NeuronHasNoError``) when the kubelet is upgraded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final, Protocol

import msgspec
from neuron_dra_common.kube import NODES, Resource

from neuron_dra_kubelet_plugin.checkpoint import PreparedDevice
from neuron_dra_kubelet_plugin.claims import ClaimRef
from neuron_dra_kubelet_plugin.plan import PrepareError
from neuron_dra_kubelet_plugin.preparer import ClaimSource, FailureReporter, Preparer

__all__ = [
    "AFFECTED",
    "FIXED_IN",
    "ISSUE",
    "REASON",
    "KubeletCheck",
    "KubeletGate",
    "Verdict",
    "has_dra_regression",
    "parse_kubelet_version",
    "verdict_for",
]

log = logging.getLogger(__name__)

#: The kubelet releases with the regression (their pre-releases too).
AFFECTED: Final = frozenset({(1, 34, 0), (1, 34, 1)})
ISSUE: Final = "kubernetes#133920"
FIXED_IN: Final = "v1.34.2"
#: The Node Event's reason and the NeuronHealth condition's.
REASON: Final = "KubeletDRARegression"
CONDITION: Final = "NeuronHealth"
NO_ERROR: Final = "NeuronHasNoError"
SETTING: Final = (
    "--allow-kubelet-dra-regression true (NEURON_DRA_ALLOW_KUBELET_DRA_REGRESSION=true)"
)
RECHECK_SECONDS: Final = 60.0
_COMPONENT: Final = "neuron-dra-kubelet-plugin"
_WHAT: Final = (
    "its gRPC connection to a DRA driver deadlocks once idle for 30 minutes, and pods then "
    "wait for their claims until the kubelet is restarted"
)

# v1.34.1, 1.34.1, v1.34.1-eks-113cf36, v1.34.1+k3s1, v1.34.0-rc.2
_VERSION_RE: Final = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:[-+][0-9A-Za-z.+-]*)?$")


def parse_kubelet_version(text: str) -> tuple[int, int, int]:
    """``(major, minor, patch)`` of a Node's ``status.nodeInfo.kubeletVersion``; a vendor's
    suffix (``-eks-...``, ``+k3s1``) or a pre-release is ignored.

    >>> parse_kubelet_version("v1.34.1-eks-113cf36")
    (1, 34, 1)
    """
    match = _VERSION_RE.match(text.strip())
    if match is None:
        raise ValueError(
            f"status.nodeInfo.kubeletVersion {text!r} is not a version like v1.34.2 "
            "(or v1.34.2-eks-...)"
        )
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch


def has_dra_regression(version: tuple[int, int, int]) -> bool:
    """Whether a kubelet of ``version`` has the regression of kubernetes#133920."""
    return version in AFFECTED


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """What the check found on this node, and what the plugin does about it."""

    node: str
    kubelet_version: str  # as the Node reports it
    affected: bool
    allowed: bool = False

    @property
    def serves(self) -> bool:
        return not self.affected or self.allowed

    def _problem(self) -> str:
        return (
            f"kubelet {self.kubelet_version} has the DRA regression {ISSUE} ({_WHAT}); "
            f"it is fixed in kubelet {FIXED_IN}"
        )

    def refusal(self) -> str:
        """The error of every claim refused on this node."""
        return (
            f"the Neuron DRA driver does not prepare claims on node {self.node}: its "
            f"{self._problem()}. Upgrade the node to kubelet {FIXED_IN} or later, or run its "
            f"kubelet plugin with {SETTING} to serve it anyway"
        )

    def message(self) -> str:
        """The Node Event's and the condition's message."""
        if self.allowed:
            return (
                f"{self._problem()}. Claims are prepared anyway ({SETTING} is set); "
                f"restart the kubelet if pods wait for their claims"
            )
        return (
            f"{self._problem()}. The Neuron DRA driver prepares no claim on this node until it "
            f"runs kubelet {FIXED_IN} or later (or its kubelet plugin runs with {SETTING})"
        )


def verdict_for(node: str, kubelet_version: str, *, allow: bool) -> Verdict:
    """The verdict for ``kubelet_version``; one that cannot be read is not held against the
    node (:class:`ValueError` is the caller's to log)."""
    affected = has_dra_regression(parse_kubelet_version(kubelet_version))
    return Verdict(node=node, kubelet_version=kubelet_version, affected=affected, allowed=allow)


class NodeApi(Protocol):
    """The API calls the check makes (``KubeClient`` has them)."""

    async def get(self, resource: Resource, name: str) -> dict[str, Any]: ...

    async def patch_status(
        self, resource: Resource, name: str, patch: Any, *, kind: Any = ...
    ) -> Any: ...

    async def post_event(
        self,
        involved: Mapping[str, str],
        *,
        reason: str,
        message: str,
        component: str,
        warning: bool = False,
        host: str = "",
    ) -> Any: ...


def _stamp(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeletCheck:
    """Reads this node's kubelet version from its Node and says what it finds."""

    def __init__(
        self,
        api: NodeApi,
        *,
        node: str,
        allow: bool,
        recheck_seconds: float = RECHECK_SECONDS,
    ) -> None:
        self._api = api
        self._node = node
        self._allow = allow
        self._recheck = recheck_seconds
        self._stopped = asyncio.Event()
        self._unreadable = ""
        self._one_at_a_time = asyncio.Lock()
        self.verdict: Verdict | None = None

    async def check(self) -> Verdict:
        """Read the Node, announce a new verdict, keep the condition; the verdict."""
        async with self._one_at_a_time:
            return await self._check()

    async def _check(self) -> Verdict:
        obj = await self._api.get(NODES, self._node)
        status = obj.get("status") or {}
        version = str((status.get("nodeInfo") or {}).get("kubeletVersion") or "")
        try:
            verdict = verdict_for(self._node, version, allow=self._allow)
        except ValueError as exc:
            if version != self._unreadable:
                log.warning("kubelet version not checked", extra={"error": str(exc)})
                self._unreadable = version
            verdict = Verdict(node=self._node, kubelet_version=version, affected=False)
        if verdict != self.verdict:
            await self._announce(verdict, obj)
        self.verdict = verdict
        await self._keep_condition(verdict, status)
        return verdict

    async def _announce(self, verdict: Verdict, node: dict[str, Any]) -> None:
        before = self.verdict
        if not verdict.affected:
            if before is not None and before.affected:
                log.info(
                    "kubelet upgraded: no DRA regression, claims are prepared",
                    extra={"kubelet_version": verdict.kubelet_version},
                )
            return
        line = "kubelet has a DRA regression: " + (
            "claims are prepared anyway, as the setting allows"
            if verdict.allowed
            else "claims are refused on this node"
        )
        log.error(
            line,
            extra={
                "kubelet_version": verdict.kubelet_version,
                "issue": ISSUE,
                "fixed_in": FIXED_IN,
                "detail": verdict.message(),
            },
        )
        meta = node.get("metadata") or {}
        involved = {
            "apiVersion": "v1",
            "kind": "Node",
            "name": self._node,
            "uid": str(meta.get("uid") or self._node),
        }
        try:
            await self._api.post_event(
                involved,
                reason=REASON,
                message=verdict.message(),
                component=_COMPONENT,
                warning=True,
                host=self._node,
            )
        except Exception as exc:  # an Event is a courtesy: the log and the condition remain
            log.warning("node event not recorded", extra={"error": repr(exc)})

    async def _keep_condition(self, verdict: Verdict, status: dict[str, Any]) -> None:
        current: dict[str, Any] = next(
            (c for c in status.get("conditions") or [] if c.get("type") == CONDITION), {}
        )
        mine = current.get("reason") == REASON
        if verdict.affected:
            wanted = ("True", REASON, verdict.message())
            if current.get("status") == "True" and not mine:
                return  # a device error the health probe reports stands
        elif mine:
            wanted = (
                "False",
                NO_ERROR,
                f"kubelet {verdict.kubelet_version} has no DRA regression ({ISSUE} is fixed)",
            )
        else:
            return
        if (current.get("status"), current.get("reason"), current.get("message")) == wanted:
            return
        now = _stamp(datetime.now(UTC))
        item = {
            "type": CONDITION,
            "status": wanted[0],
            "reason": wanted[1],
            "message": wanted[2][:1024],
            "lastHeartbeatTime": now,
        }
        if current.get("status") != wanted[0]:
            item["lastTransitionTime"] = now
        await self._api.patch_status(
            NODES, self._node, {"status": {"conditions": [item]}}, kind="strategic"
        )
        log.info("node condition written", extra={"condition": CONDITION, "reason": wanted[1]})

    async def run(self) -> None:
        """Check now and then every ``recheck_seconds`` until stopped; an API error is
        logged and tried again at the next round."""
        while not self._stopped.is_set():
            try:
                await self.check()
            except Exception as exc:
                log.warning("kubelet version check failed", extra={"error": repr(exc)})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), timeout=self._recheck)

    def stop(self) -> None:
        self._stopped.set()


class KubeletGate:
    """A :class:`~neuron_dra_kubelet_plugin.preparer.Preparer` that refuses every claim on a
    node whose kubelet has the regression (unless allowed); unprepare always runs.

    A refused claim is also told to ``reporter`` (a Warning Event on its pods: some kubelets
    only log a failed prepare), once per claim; ``claims`` reads it for that.
    """

    def __init__(
        self,
        inner: Preparer,
        check: KubeletCheck,
        *,
        claims: ClaimSource | None = None,
        reporter: FailureReporter | None = None,
    ) -> None:
        self._inner = inner
        self._check = check
        self._claims = claims
        self._reporter = reporter
        self._told: set[str] = set()

    async def prepare(self, ref: ClaimRef) -> tuple[PreparedDevice, ...]:
        verdict = self._check.verdict
        if verdict is None:  # the first call came before the first check finished
            try:
                verdict = await self._check.check()
            except Exception as exc:
                raise PrepareError(
                    f"{ref}: the kubelet version of this node could not be read: {exc}"
                ) from None
        if not verdict.serves:
            await self._tell(ref, verdict.refusal())
            raise PrepareError(verdict.refusal())
        return await self._inner.prepare(ref)

    async def _tell(self, ref: ClaimRef, message: str) -> None:
        if self._claims is None or self._reporter is None or ref.uid in self._told:
            return
        try:
            claim = await self._claims.get(ref)
        except Exception as exc:  # the Event is a courtesy: the kubelet gets the error anyway
            log.warning("refused claim not read", extra={"claim": str(ref), "error": repr(exc)})
            return
        self._told.add(ref.uid)
        if claim is not None:
            self._reporter.failed(claim, message)

    async def unprepare(self, ref: ClaimRef) -> None:
        await self._inner.unprepare(ref)
