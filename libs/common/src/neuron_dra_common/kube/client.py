"""The Kubernetes API client: typed verbs over kubernetes-asyncio's transport.

kubernetes-asyncio loads the configuration (:mod:`neuron_dra_common.kube.config`) and
carries every request (``ApiClient.call_api`` over its aiohttp session: TLS with the
kubeconfig's CA alone, client certificates, ``tls-server-name``, proxies, the bearer token).
This module adds what the services need above it: verbs that build no URL from unchecked
input (names are checked before a byte is sent), answers decoded with msgspec from the raw
bytes (``_preload_content=False``; metadata-only answers without ``managedFields``), a client
span and ``traceparent`` on every call, the request metric, and errors mapped onto
:class:`ApiException` (an answer) and :data:`UNANSWERED` (no answer).

>>> client = await connect(kubeconfig="~/.kube/config")  # doctest: +SKIP
>>> node = await client.get(NODES, "trn2-0")  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import AsyncGenerator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

import aiohttp
import msgspec
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException as LibraryApiException
from kubernetes_asyncio.config.config_exception import ConfigException
from opentelemetry import trace

from neuron_dra_common.gcpause import paused
from neuron_dra_common.kube.config import (
    EXEC_TIMEOUT,
    ConfigError,
    KubeConfig,
    load_in_cluster,
    load_kubeconfig,
)
from neuron_dra_common.kube.metrics import REQUESTS, resource_of
from neuron_dra_common.kube.names import check_name, check_namespace, check_subresource
from neuron_dra_common.kube.proxy import honour_no_proxy
from neuron_dra_common.telemetry.propagation import kube_trace_headers
from neuron_dra_common.telemetry.tracing import get_tracer, tracing_enabled

__all__ = [
    "CONFIGMAPS",
    "EVENTS",
    "JSON",
    "METADATA",
    "NODES",
    "PODS",
    "PROTOBUF",
    "RESOURCE_CLAIMS",
    "RESOURCE_SLICES",
    "UNANSWERED",
    "ApiException",
    "ConnectionLost",
    "KubeClient",
    "KubeConfig",
    "PatchKind",
    "Resource",
    "close_open_clients",
    "connect",
    "object_key",
    "retriable",
]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
#: A patch: an object, or the operations of a JSON patch.
Patch = Obj | list[Any]
Body = Obj | list[Any] | bytes | None
PatchKind = Literal["merge", "strategic", "json", "apply"]


class ApiException(Exception):
    """The apiserver answered with an error: ``status`` (HTTP), ``reason`` (what was asked
    and the server's message) and the raw ``body`` (a Status object, usually)."""

    def __init__(self, status: int = 0, reason: str = "", body: bytes = b"") -> None:
        super().__init__(status, reason)
        self.status = status
        self.reason = reason
        self.body = body

    def __str__(self) -> str:
        return f"({self.status}) {self.reason}"


class ConnectionLost(OSError):
    """No answer: the connection ended before the answer did (the apiserver restarted, a
    proxy cut it), or the request could not be sent (the token file unreadable meanwhile)."""


#: What a call fails with when no answer came back (the apiserver down, restarting, or too
#: slow): worth trying again, unlike most answers an :class:`ApiException` carries. Every
#: transport error of aiohttp arrives as one of these.
UNANSWERED: Final = (OSError, TimeoutError)


def retriable(exc: ApiException) -> bool:
    """Whether an error answer says "later" (overloaded, unavailable, timed out) rather than
    "no": 429 and every 5xx."""
    return exc.status == 429 or exc.status >= 500


def _decode(data: bytes) -> Obj:
    decoded: Obj = msgspec.json.decode(data)
    return decoded


class _Metadata(msgspec.Struct, omit_defaults=True):
    """An object's metadata as the API answers it, but for ``managedFields``.

    The field managers of a written object describe every field it has (for a ResourceSlice,
    every device attribute): a writer that only needs names, versions and annotations back
    should not build them. Fields left unset are left out of :func:`msgspec.to_builtins`.
    """

    name: str | msgspec.UnsetType = msgspec.UNSET
    generateName: str | msgspec.UnsetType = msgspec.UNSET
    namespace: str | msgspec.UnsetType = msgspec.UNSET
    uid: str | msgspec.UnsetType = msgspec.UNSET
    resourceVersion: str | msgspec.UnsetType = msgspec.UNSET
    generation: int | msgspec.UnsetType = msgspec.UNSET
    creationTimestamp: str | msgspec.UnsetType = msgspec.UNSET
    deletionTimestamp: str | msgspec.UnsetType = msgspec.UNSET
    deletionGracePeriodSeconds: int | msgspec.UnsetType = msgspec.UNSET
    labels: dict[str, str] | msgspec.UnsetType = msgspec.UNSET
    annotations: dict[str, str] | msgspec.UnsetType = msgspec.UNSET
    ownerReferences: list[dict[str, Any]] | msgspec.UnsetType = msgspec.UNSET
    finalizers: list[str] | msgspec.UnsetType = msgspec.UNSET


class _PartialObject(msgspec.Struct, omit_defaults=True):
    apiVersion: str | msgspec.UnsetType = msgspec.UNSET
    kind: str | msgspec.UnsetType = msgspec.UNSET
    metadata: _Metadata | msgspec.UnsetType = msgspec.UNSET


class _PartialObjectList(msgspec.Struct, omit_defaults=True):
    apiVersion: str | msgspec.UnsetType = msgspec.UNSET
    kind: str | msgspec.UnsetType = msgspec.UNSET
    metadata: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
    # An empty PartialObjectMetadataList comes with "items": null.
    items: list[_PartialObject] | msgspec.UnsetType | None = msgspec.UNSET


class _WatchEvent(msgspec.Struct):
    type: str
    object: msgspec.Raw


_decode_partial: Final = msgspec.json.Decoder(_PartialObject).decode
_decode_partial_list: Final = msgspec.json.Decoder(_PartialObjectList).decode
_decode_event: Final = msgspec.json.Decoder(_WatchEvent).decode
_USER_AGENT: Final = "neuron-dra"


def _decode_metadata(data: bytes) -> Obj:
    decoded: Obj = msgspec.to_builtins(_decode_partial(data))
    return decoded


def _decode_metadata_list(data: bytes) -> Obj:
    decoded: Obj = msgspec.to_builtins(_decode_partial_list(data))
    return decoded


def _decode_metadata_event(line: bytes) -> Obj:
    """A watch event of ``PartialObjectMetadata``; an ``ERROR`` event's Status as it is."""
    event = _decode_event(line)
    if event.type == "ERROR":
        return _decode(line)
    return {"type": event.type, "object": _decode_metadata(event.object)}


class Resource(msgspec.Struct, frozen=True, kw_only=True):
    """A kind of API object: where its collection lives.

    >>> Resource(group="resource.k8s.io", version="v1", plural="resourceslices").path()
    '/apis/resource.k8s.io/v1/resourceslices'
    """

    group: str
    version: str
    plural: str
    kind: str = ""
    namespaced: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self,
        *,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> str:
        """The path of the collection, an object or its subresource; every part is checked
        (:mod:`neuron_dra_common.kube.names`), so no unchecked text reaches a request."""
        what = self.kind or self.plural
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{check_namespace(namespace, kind=what)}"
        base += f"/{self.plural}"
        if name is None:
            if subresource:
                raise ValueError(f"{what}: a subresource needs an object name")
            return base
        base += f"/{check_name(name, kind=what)}"
        if subresource:
            base += f"/{check_subresource(subresource, kind=what)}"
        return base


JSON: Final = "application/json"
#: Kubernetes' protobuf encoding (built-in kinds only): ``k8s\x00`` and a ``runtime.Unknown``.
PROTOBUF: Final = "application/vnd.kubernetes.protobuf"
#: Server-side conversion to metadata only (what metadata informers ask for).
METADATA: Final = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
METADATA_LIST: Final = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
_PATCH_TYPES: Final[dict[str, str]] = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
    "apply": "application/apply-patch+yaml",
}

NODES: Final = Resource(group="", version="v1", plural="nodes", kind="Node")
PODS: Final = Resource(group="", version="v1", plural="pods", kind="Pod", namespaced=True)
EVENTS: Final = Resource(group="", version="v1", plural="events", kind="Event", namespaced=True)
CONFIGMAPS: Final = Resource(
    group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True
)
RESOURCE_SLICES: Final = Resource(
    group="resource.k8s.io", version="v1", plural="resourceslices", kind="ResourceSlice"
)
RESOURCE_CLAIMS: Final = Resource(
    group="resource.k8s.io",
    version="v1",
    plural="resourceclaims",
    kind="ResourceClaim",
    namespaced=True,
)
#: An Event's longest message (the apiserver refuses longer ones).
MAX_EVENT_MESSAGE: Final = 1024


def _stamp(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


#: Clients not closed yet: a process that ends before its service closed them (a start that
#: failed half-way) closes them with :func:`close_open_clients`. Held strongly: a client
#: dropped unclosed would otherwise be reported by aiohttp as soon as it is collected.
_OPEN: Final[set[KubeClient]] = set()


async def close_open_clients() -> None:
    """Close every client of this process not closed yet, so that none is reported unclosed
    after the process's last word (a one-line start error)."""
    for client in list(_OPEN):
        await client.close()


class KubeClient:
    """Typed verbs on the API with plain JSON objects (dicts).

    Every call runs in a client span (``kube METHOD path``) and sends ``traceparent``, so an
    apiserver with tracing on joins the caller's trace. Names and namespaces are checked
    before anything is sent (:class:`~neuron_dra_common.kube.names.InvalidName`).

    >>> client = KubeClient(await load_kubeconfig("~/.kube/config"))  # doctest: +SKIP
    """

    def __init__(self, config: KubeConfig, *, pool_size: int = 100) -> None:
        self.config = config
        self._tracer = get_tracer()
        configuration = config.configuration
        configuration.connection_pool_maxsize = pool_size
        if not configuration.proxy:
            honour_no_proxy(config.server)
        try:
            self._api = ApiClient(configuration)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"kubeconfig {config.source}: the TLS settings cannot be used "
                f"(certificate authority, client certificate or key): {exc}"
            ) from None
        self._api.user_agent = _USER_AGENT
        self._refresher: asyncio.Task[None] | None = None
        self._refresh_now = asyncio.Event()
        _OPEN.add(self)

    @property
    def server(self) -> str:
        return self.config.server

    async def close(self) -> None:
        _OPEN.discard(self)
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)
            self._refresher = None
        await self._api.close()

    # -- credentials ---------------------------------------------------------------------

    def _start_refresher(self) -> None:
        if self.config.loader is not None and self._refresher is None:
            self._refresher = asyncio.create_task(
                self._refresh_exec(), name="kube-exec-credential-refresh"
            )

    async def _refresh_exec(self) -> None:
        """Keeps an exec plugin's token fresh, off the path of every request.

        A call never waits for the plugin: it uses the last token, and a 401 only wakes
        this task. The plugin runs under the guard that kills it at its timeout; a failure
        keeps the last token and is tried again after a pause.
        """
        pause = 1.0
        while True:
            loader = self.config.loader
            assert loader is not None
            expiry = getattr(loader, "exec_plugin_expiry", None)
            wait: float | None = None
            if isinstance(expiry, datetime):
                # The library runs the plugin again from 5 minutes before the expiry.
                wait = max(1.0, (expiry - datetime.now(UTC)).total_seconds() - 299)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._refresh_now.wait(), timeout=wait)
            forced = self._refresh_now.is_set()
            self._refresh_now.clear()
            if forced:
                # The token was refused: run the plugin whatever expiry it stated (a loader
                # runs it only once its recorded expiry is near; a new one has none).
                self.config.renew_loader()
                loader = self.config.loader
                assert loader is not None
            try:
                async with asyncio.timeout(self.config.exec_timeout + 10):
                    await loader.load_from_exec_plugin()
                # A plugin that answers with a client certificate sets no token.
                token = getattr(loader, "token", None)
                if token:
                    self.config.configuration.api_key["BearerToken"] = token
                pause = 1.0
            except Exception as exc:  # whatever the plugin did, the task goes on
                log.warning(
                    "exec credential plugin failed; keeping the last token",
                    extra={"source": self.config.source, "error": str(exc), "retry_in": pause},
                )
                await asyncio.sleep(pause)
                pause = min(pause * 2, 60.0)
                self._refresh_now.set()

    def _unauthorized(self) -> None:
        self.config.expire_token()
        if self.config.loader is not None:
            self._refresh_now.set()

    # -- transport -----------------------------------------------------------------------

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]],
        body: Body,
        content_type: str,
        accept: str,
        read_limits: aiohttp.ClientTimeout | None = None,
    ) -> aiohttp.ClientResponse:
        """One request; returns the response once its head is in (status < 400)."""
        self._start_refresher()
        if isinstance(body, bytes) and "json" in content_type:
            # The transport JSON-encodes whatever it is given with a JSON content type.
            raise TypeError(f"{method} {path}: pre-encoded bodies go as {PROTOBUF} only")
        headers = {"Accept": accept, "Content-Type": content_type, **kube_trace_headers()}
        watching = ("watch", "1") in query
        REQUESTS.labels("WATCH" if watching else method, resource_of(path)).inc()
        try:
            resp: aiohttp.ClientResponse = await self._api.call_api(
                path,
                method,
                query_params=list(query),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=read_limits,
            )
        except LibraryApiException as exc:
            raise ApiException(
                status=exc.status or 0, reason=f"{method} {path}: {exc.reason}"
            ) from exc
        except (OSError, TimeoutError):
            raise
        except aiohttp.ClientError as exc:
            raise ConnectionLost(f"{method} {path}: {exc!r}") from exc
        except ConfigException as exc:
            # The library's token hook could not read the token (a service-account token
            # being rotated): nothing was sent; worth trying again like a lost connection.
            raise ConnectionLost(f"{method} {path}: no credentials: {exc}") from exc
        if resp.status >= 400:
            try:
                text = await resp.read()
            except aiohttp.ClientError:
                text = b""
            finally:
                resp.release()
            if resp.status == 401:
                self._unauthorized()
            raise _api_error(resp.status, method, path, text)
        return resp

    async def _exchange(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Body = None,
        content_type: str = JSON,
        accept: str = JSON,
        request_timeout: float | None = 30.0,
    ) -> bytes:
        # A span only when tracing is on: one nobody records still costs about 30 us of
        # the 200 us of CPU a GET takes here. The caller's trace context goes out either
        # way (``traceparent``, see ``_call``).
        span = (
            self._tracer.start_as_current_span(
                f"kube {method} {path}",
                kind=trace.SpanKind.CLIENT,
                attributes={"http.request.method": method, "url.path": path},
            )
            if tracing_enabled()
            else contextlib.nullcontext()
        )
        with span:
            async with asyncio.timeout(request_timeout):
                resp = await self._send(
                    method, path, query=query, body=body, content_type=content_type, accept=accept
                )
                try:
                    data = await resp.read()
                except aiohttp.ClientError as exc:
                    resp.close()
                    raise ConnectionLost(f"{method} {path}: {exc!r}") from exc
                except BaseException:
                    # Cancelled or timed out mid-body: the connection cannot serve again.
                    resp.close()
                    raise
                resp.release()
        return data

    async def _call(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Body = None,
        content_type: str = JSON,
        metadata_only: bool = False,
    ) -> Obj:
        accept = METADATA if metadata_only else JSON
        data = await self._exchange(
            method, path, query=query, body=body, content_type=content_type, accept=accept
        )
        if not data:
            return {}
        return _decode_metadata(data) if metadata_only else _decode(data)

    # -- verbs ---------------------------------------------------------------------------

    async def get(
        self,
        resource: Resource,
        name: str,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        metadata_only: bool = False,
    ) -> Obj:
        """One object (or its ``subresource``), as stored."""
        path = resource.path(namespace=namespace, name=name, subresource=subresource)
        return await self._call("GET", path, metadata_only=metadata_only)

    async def server_version(self) -> str:
        """The apiserver's ``gitVersion`` (``v1.36.3``), from ``/version``: every
        authenticated identity may read it (the ClusterRole ``system:public-info-viewer``)."""
        info = await self._call("GET", "/version")
        return str(info.get("gitVersion", ""))

    async def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        page_size: int = 500,
        metadata_only: bool = False,
    ) -> tuple[list[Obj], str]:
        """All objects (paginated) and the list's resourceVersion to watch from.

        ``metadata_only``: each object as a ``PartialObjectMetadata`` (apiVersion, kind,
        metadata without ``managedFields``), which costs the server and the client a fraction
        of a large object.
        """
        items: list[Obj] = []
        cont = ""
        path = resource.path(namespace=namespace)
        while True:
            query = [("limit", str(page_size))]
            if cont:
                query.append(("continue", cont))
            query += _selectors(label_selector, field_selector)
            accept = METADATA_LIST if metadata_only else JSON
            data = await self._exchange("GET", path, query=query, accept=accept)
            with paused():
                page = (
                    (_decode_metadata_list(data) if metadata_only else _decode(data))
                    if data
                    else {}
                )
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            cont = meta.get("continue") or ""
            if not cont:
                return items, str(meta.get("resourceVersion", ""))

    async def watch(
        self,
        resource: Resource,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        timeout_seconds: int = 300,
        metadata_only: bool = False,
    ) -> AsyncGenerator[Obj, None]:
        """Watch events (``{"type", "object"}``) from ``resource_version``, bookmarks on.

        Ends when the server closes the watch; an ``ERROR`` event is yielded as is (its
        object is a Status, code 410 when the version is too old). ``metadata_only`` objects
        are ``PartialObjectMetadata`` without ``managedFields``.
        """
        path = resource.path(namespace=namespace)
        query = [
            ("watch", "1"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
            *_selectors(label_selector, field_selector),
        ]
        # The server ends the watch after timeout_seconds; silence for longer means it is gone.
        read_timeout = float(timeout_seconds + 30)
        async with asyncio.timeout(30.0):
            resp = await self._send(
                "GET",
                path,
                query=query,
                body=None,
                content_type=JSON,
                accept=METADATA if metadata_only else JSON,
                read_limits=aiohttp.ClientTimeout(sock_connect=30.0, sock_read=read_timeout),
            )
        decode = _decode_metadata_event if metadata_only else _decode
        done = False
        try:
            buffer = bytearray()
            try:
                async for chunk in resp.content.iter_any():
                    buffer += chunk
                    while (end := buffer.find(b"\n")) >= 0:
                        line = bytes(buffer[: end + 1])
                        del buffer[: end + 1]
                        if line.strip():
                            yield decode(line)
            except aiohttp.ClientError as exc:
                raise ConnectionLost(f"watch {path}: {exc!r}") from exc
            if buffer.strip():
                yield decode(bytes(buffer))
            done = True
        finally:
            # Stopped (aclose, cancel) or failed before the stream's end, the connection is
            # dropped rather than drained.
            if done:
                resp.release()
            else:
                resp.close()

    async def create(
        self,
        resource: Resource,
        body: Obj | bytes,
        *,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
        content_type: str = JSON,
        field_manager: str = "",
        dry_run: bool = False,
        metadata_only: bool = False,
    ) -> Obj:
        """Create ``body`` (an object, or bytes already encoded as ``content_type`` says,
        e.g. :data:`PROTOBUF`); returns the object as stored (its metadata only, with
        ``metadata_only``). ``namespace`` defaults to the body's. ``name`` and
        ``subresource`` create a subresource of an object (``pods/binding``)."""
        if namespace is None and resource.namespaced and isinstance(body, Mapping):
            namespace = (body.get("metadata") or {}).get("namespace")
        if resource.namespaced and not namespace:
            raise ValueError(f"{resource.kind or resource.plural}: create needs a namespace")
        path = resource.path(namespace=namespace, name=name, subresource=subresource)
        return await self._call(
            "POST",
            path,
            query=_write_query(field_manager=field_manager, dry_run=dry_run),
            body=body,
            content_type=content_type,
            metadata_only=metadata_only,
        )

    async def replace(
        self,
        resource: Resource,
        name: str,
        body: Obj | bytes,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        content_type: str = JSON,
        field_manager: str = "",
        dry_run: bool = False,
        metadata_only: bool = False,
    ) -> Obj:
        """Replace the object (PUT); ``body`` carries the ``resourceVersion`` it replaces
        for an optimistic write (409 when the object changed meanwhile)."""
        path = resource.path(namespace=namespace, name=name, subresource=subresource)
        return await self._call(
            "PUT",
            path,
            query=_write_query(field_manager=field_manager, dry_run=dry_run),
            body=body,
            content_type=content_type,
            metadata_only=metadata_only,
        )

    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Patch,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        kind: PatchKind = "merge",
        field_manager: str = "",
        force: bool = False,
        dry_run: bool = False,
    ) -> Obj:
        """Patch the object: ``merge`` (RFC 7386), ``strategic`` (built-in kinds), ``json``
        (RFC 6902, ``patch`` is a list of operations) or ``apply`` (server-side apply;
        needs ``field_manager``, ``force`` takes conflicting fields over)."""
        if kind == "apply" and not field_manager:
            raise ValueError(f"{resource.kind or resource.plural} {name}: apply needs a manager")
        query = _write_query(field_manager=field_manager, dry_run=dry_run)
        if force:
            query.append(("force", "true"))
        path = resource.path(namespace=namespace, name=name, subresource=subresource)
        return await self._call(
            "PATCH", path, query=query, body=patch, content_type=_PATCH_TYPES[kind]
        )

    async def delete(
        self,
        resource: Resource,
        name: str,
        *,
        namespace: str | None = None,
        uid: str = "",
        resource_version: str = "",
        propagation: Literal["Foreground", "Background", "Orphan"] | None = None,
        grace_period: int | None = None,
        dry_run: bool = False,
    ) -> Obj:
        """Delete the object; with ``uid`` / ``resource_version``, only if it is still that
        very object / version (409 otherwise: one made again under the same name stays)."""
        path = resource.path(namespace=namespace, name=name)
        options: Obj = {}
        preconditions = {
            k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v
        }
        if preconditions:
            options["preconditions"] = preconditions
        if propagation:
            options["propagationPolicy"] = propagation
        if grace_period is not None:
            options["gracePeriodSeconds"] = grace_period
        if dry_run:
            options["dryRun"] = ["All"]
        body = {"apiVersion": "v1", "kind": "DeleteOptions", **options} if options else None
        return await self._call("DELETE", path, body=body)

    async def delete_collection(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        grace_period: int | None = None,
    ) -> Obj:
        """Delete every object the selectors match (all of them without one)."""
        path = resource.path(namespace=namespace)
        body = None
        if grace_period is not None:
            body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": grace_period}
        query = _selectors(label_selector, field_selector)
        return await self._call("DELETE", path, query=query, body=body)

    async def get_status(
        self, resource: Resource, name: str, *, namespace: str | None = None
    ) -> Obj:
        """The object through its ``status`` subresource."""
        return await self.get(resource, name, namespace=namespace, subresource="status")

    async def replace_status(
        self, resource: Resource, name: str, body: Obj, *, namespace: str | None = None
    ) -> Obj:
        """Replace the object's status (its spec in ``body`` is ignored)."""
        return await self.replace(resource, name, body, namespace=namespace, subresource="status")

    async def patch_status(
        self,
        resource: Resource,
        name: str,
        patch: Patch,
        *,
        namespace: str | None = None,
        kind: PatchKind = "merge",
        field_manager: str = "",
        force: bool = False,
    ) -> Obj:
        """Patch the object's status subresource (see :meth:`patch`)."""
        return await self.patch(
            resource,
            name,
            patch,
            namespace=namespace,
            subresource="status",
            kind=kind,
            field_manager=field_manager,
            force=force,
        )

    async def post_event(
        self,
        involved: Mapping[str, str],
        *,
        reason: str,
        message: str,
        component: str,
        warning: bool = False,
        host: str = "",
    ) -> Obj:
        """Record a core/v1 Event on ``involved`` (``apiVersion``, ``kind``, ``name``,
        ``uid`` and, for a namespaced object, ``namespace``); cluster objects' Events go to
        ``default``. ``host`` names the reporting node, if any.

        >>> await client.post_event(  # doctest: +SKIP
        ...     {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "n1"},
        ...     reason="NodeLost", message="no heartbeat for 3 s", component="detector",
        ...     warning=True)
        """
        name = check_name(str(involved.get("name", "")), field="involvedObject.name", kind="Event")
        namespace = str(involved.get("namespace") or "default")
        now = _stamp()
        source: dict[str, str] = {"component": component}
        if host:
            source["host"] = host
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": dict(involved),
            "reason": reason,
            "message": message[:MAX_EVENT_MESSAGE],
            "type": "Warning" if warning else "Normal",
            "source": source,
            "reportingComponent": component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        if host:
            body["reportingInstance"] = host
        return await self.create(EVENTS, body, namespace=namespace)


def _selectors(label_selector: str, field_selector: str) -> list[tuple[str, str]]:
    query = []
    if label_selector:
        query.append(("labelSelector", label_selector))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    return query


def _write_query(*, field_manager: str, dry_run: bool) -> list[tuple[str, str]]:
    query = []
    if field_manager:
        query.append(("fieldManager", field_manager))
    if dry_run:
        query.append(("dryRun", "All"))
    return query


async def connect(
    *,
    kubeconfig: Path | str | None = None,
    context: str | None = None,
    exec_timeout: float | None = None,
) -> KubeClient:
    """A client from ``kubeconfig`` (or ``$KUBECONFIG``), else the pod's service account.

    Raises :class:`~neuron_dra_common.kube.config.ConfigError` naming the file and field
    that cannot be used.
    """
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        timeout = EXEC_TIMEOUT if exec_timeout is None else exec_timeout
        config = await load_kubeconfig(path, context=context, exec_timeout=timeout)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config = load_in_cluster()
    else:
        raise ConfigError(
            "Kubernetes client: no kubeconfig given, KUBECONFIG unset, and not in a pod "
            "(KUBERNETES_SERVICE_HOST unset)"
        )
    return KubeClient(config)


def _api_error(status: int, method: str, path: str, body: bytes) -> ApiException:
    try:
        message = str(_decode(body).get("message", ""))
    except (ValueError, AttributeError):
        message = body[:200].decode(errors="replace")
    return ApiException(status=status, reason=f"{method} {path}: {message or status}", body=body)


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` (or ``name`` for cluster objects), as caches and queues key them."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))
