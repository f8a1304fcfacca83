"""The Kubernetes API client: kubeconfig or in-cluster, raw JSON, traced calls."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import urllib.request
from collections.abc import AsyncGenerator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote, urlencode, urlsplit

import msgspec
from opentelemetry import trace

from neuron_dra_common.httpclient import HttpClient, Response
from neuron_dra_common.kube.auth import Credentials
from neuron_dra_common.kube.config import (
    ConfigError,
    KubeConfig,
    load_in_cluster,
    load_kubeconfig,
    ssl_context,
)
from neuron_dra_common.kube.metrics import REQUESTS, resource_of
from neuron_dra_common.telemetry.propagation import kube_trace_headers
from neuron_dra_common.telemetry.tracing import get_tracer, tracing_enabled

__all__ = [
    "CONFIGMAPS",
    "JSON",
    "METADATA",
    "NODES",
    "PROTOBUF",
    "RESOURCE_CLAIMS",
    "RESOURCE_SLICES",
    "UNANSWERED",
    "ApiException",
    "KubeClient",
    "KubeConfig",
    "Resource",
    "connect",
    "object_key",
    "retriable",
]

Obj = dict[str, Any]


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


#: What a call fails with when no answer came back (the apiserver down, restarting, or too
#: slow): worth trying again, unlike most answers an :class:`ApiException` carries.
UNANSWERED: Final = (OSError, TimeoutError)


def retriable(exc: ApiException) -> bool:
    """Whether an error answer says "later" (overloaded, unavailable, timed out) rather than
    "no": 429 and every 5xx."""
    return exc.status == 429 or exc.status >= 500


# Request bodies are encoded here, once, and sent as bytes: the generated client would walk
# every value of a large object (sanitize_for_serialization) and then json.dumps it.
_encode: Final = msgspec.json.Encoder().encode


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

    def path(self, *, namespace: str | None = None, name: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name else base


JSON: Final = "application/json"
#: Kubernetes' protobuf encoding (built-in kinds only): ``k8s\x00`` and a ``runtime.Unknown``.
PROTOBUF: Final = "application/vnd.kubernetes.protobuf"
#: Server-side conversion to metadata only (what metadata informers ask for).
METADATA: Final = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
METADATA_LIST: Final = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"

NODES: Final = Resource(group="", version="v1", plural="nodes", kind="Node")
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


class KubeClient:
    """Thin async access to the API with plain JSON objects (dicts).

    Every call runs in a client span and sends ``traceparent``, so an apiserver with tracing
    on joins the caller's trace.

    >>> client = KubeClient(load_kubeconfig("~/.kube/config"))  # doctest: +SKIP
    """

    def __init__(self, config: KubeConfig, *, pool_size: int = 100) -> None:
        self.config = config
        self._tracer = get_tracer()
        self._credentials = Credentials(config)
        self._ssl = ssl_context(config) if config.server.startswith("https:") else None
        # The environment's proxy is read once, here. A kubeconfig proxy-url wins.
        proxy, proxy_headers = (
            (config.proxy_url, {}) if config.proxy_url else proxy_from_env(config.server)
        )
        self._http = HttpClient(
            config.server,
            ssl=self._ssl,
            server_hostname=config.tls_server_name or None,
            proxy=proxy,
            proxy_headers=proxy_headers,
            pool_size=pool_size,
        )

    @property
    def server(self) -> str:
        return self.config.server

    async def close(self) -> None:
        # Connections are dropped, not shut down politely: a TLS close waits for the peer's
        # reply, and a caller that closes its loop right after would leave the socket open.
        await self._http.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Obj | bytes | None = None,
        content_type: str = JSON,
        request_timeout: float | None = 30.0,
        accept: str = JSON,
    ) -> Obj:
        """One call; returns the decoded JSON body. Raises ``ApiException`` on HTTP errors.

        ``body`` is a JSON object, or bytes already encoded as ``content_type`` says (for
        example :data:`PROTOBUF`).
        """
        data = await self._exchange(
            method, path, query, body, content_type, request_timeout, accept
        )
        return _decode(data) if data else {}

    async def request_metadata(
        self,
        method: str,
        path: str,
        *,
        body: Obj | bytes | None = None,
        query: Sequence[tuple[str, str]] = (),
        content_type: str = JSON,
        request_timeout: float | None = 30.0,
    ) -> Obj:
        """A call (typically a create or replace) answered with the object's metadata only.

        The apiserver converts the response of a write to ``PartialObjectMetadata`` as it
        does for reads, so it does not serialize the object's spec, nor does this client
        decode it; ``managedFields`` are left out of the result too. Returns ``apiVersion``,
        ``kind`` and ``metadata`` (name, uid, resourceVersion, labels, annotations, ...).
        """
        data = await self._exchange(
            method, path, query, body, content_type, request_timeout, METADATA
        )
        return _decode_metadata(data) if data else {}

    async def _exchange(
        self,
        method: str,
        path: str,
        query: Sequence[tuple[str, str]],
        body: Obj | bytes | None,
        content_type: str,
        request_timeout: float | None,
        accept: str,
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
                resp = await self._call(
                    method, path, query=query, body=body, content_type=content_type, accept=accept
                )
                async with resp:
                    data: bytes = await resp.read()
        return data

    async def _call(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]],
        body: Obj | bytes | None,
        content_type: str,
        accept: str = JSON,
        read_timeout: float | None = None,
    ) -> Response:
        headers = {"Accept": accept, "Content-Type": content_type, "User-Agent": _USER_AGENT}
        headers.update(kube_trace_headers())
        params = list(query)
        watching = ("watch", "1") in params
        REQUESTS.labels("WATCH" if watching else method, resource_of(path)).inc()
        authorization = await self._credentials.authorization()
        if authorization is not None:
            headers["Authorization"] = authorization
        target = f"{path}?{urlencode(params)}" if params else path
        resp = await self._http.request(
            method,
            target,
            headers=headers,
            body=body if body is None or isinstance(body, bytes) else _encode(body),
            read_timeout=read_timeout,
        )
        if resp.status >= 400:
            async with resp:
                text = await resp.read(read_timeout=read_timeout)
            if resp.status == 401:
                self._credentials.expire()
            raise _api_error(resp.status, method, path, text)
        return resp

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> Obj:
        return await self.request("GET", resource.path(namespace=namespace, name=name))

    async def delete(self, resource: Resource, name: str, *, namespace: str | None = None) -> Obj:
        return await self.request("DELETE", resource.path(namespace=namespace, name=name))

    async def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str = "",
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
        while True:
            query = [("limit", str(page_size))]
            if cont:
                query.append(("continue", cont))
            if label_selector:
                query.append(("labelSelector", label_selector))
            path = resource.path(namespace=namespace)
            if metadata_only:
                data = await self._exchange("GET", path, query, None, JSON, 30.0, METADATA_LIST)
                page = _decode_metadata_list(data) if data else {}
            else:
                page = await self.request("GET", path, query=query)
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
        timeout_seconds: int = 300,
        metadata_only: bool = False,
    ) -> AsyncGenerator[Obj, None]:
        """Watch events (``{"type", "object"}``) from ``resource_version``, bookmarks on.

        Ends when the server closes the watch; an ``ERROR`` event is yielded as is (its
        object is a Status, code 410 when the version is too old). ``metadata_only`` objects
        are ``PartialObjectMetadata`` without ``managedFields`` (the field managers describe
        every field of the object, and a watcher of metadata has no use for them).
        """
        query = [
            ("watch", "1"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        if label_selector:
            query.append(("labelSelector", label_selector))
        # The server ends the watch after timeout_seconds; silence for longer means it is gone.
        read_timeout = timeout_seconds + 30
        async with asyncio.timeout(30.0):
            resp = await self._call(
                "GET",
                resource.path(namespace=namespace),
                query=query,
                body=None,
                content_type="application/json",
                accept=METADATA if metadata_only else JSON,
                read_timeout=read_timeout,
            )
        decode = _decode_metadata_event if metadata_only else _decode
        # Stopped (aclose, cancel) or failed before the stream's end, the connection is
        # dropped: a polite TLS close could outlive the event loop.
        async with resp:
            async for line in resp.lines(read_timeout=read_timeout):
                if line.strip():
                    yield decode(line)


async def connect(
    *, kubeconfig: Path | str | None = None, context: str | None = None
) -> KubeClient:
    """A client from ``kubeconfig`` (or ``$KUBECONFIG``), else the pod's service account.

    Raises :class:`~neuron_dra_common.kube.config.ConfigError` naming the file and field
    that cannot be used.
    """
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        config = load_kubeconfig(path, context=context)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config = load_in_cluster()
    else:
        raise ConfigError(
            "Kubernetes client: no kubeconfig given, KUBECONFIG unset, and not in a pod "
            "(KUBERNETES_SERVICE_HOST unset)"
        )
    return KubeClient(config)


def proxy_from_env(url: str) -> tuple[str | None, dict[str, str]]:
    """The proxy the environment names for ``url`` (``HTTPS_PROXY``, ``NO_PROXY``, ...) and
    the headers it needs (credentials in its URL become ``Proxy-Authorization``).

    >>> proxy_from_env("https://10.0.0.1:6443")  # with no proxy variables set
    (None, {})
    """
    parts = urlsplit(url)
    if parts.hostname and urllib.request.proxy_bypass(parts.hostname):
        return None, {}
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy:
        return None, {}
    named = urlsplit(proxy)
    if not named.username or named.hostname is None:
        return proxy, {}
    pair = f"{unquote(named.username)}:{unquote(named.password or '')}".encode("latin-1")
    auth = "Basic " + base64.b64encode(pair).decode("ascii")
    netloc = named.hostname + (f":{named.port}" if named.port else "")
    return named._replace(netloc=netloc).geturl(), {"Proxy-Authorization": auth}


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
