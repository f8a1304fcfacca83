"""Settings: a frozen Struct filled from flags, then environment variables, then defaults.

Every field ``http_port`` of a settings Struct is read from ``--http-port`` or, when the flag is
absent, from ``NEURON_DRA_HTTP_PORT``. A bad value stops the service at start with a message
naming the variable (or flag) and what it expected::

    NEURON_DRA_HTTP_PORT='http': expected an integer between 0 and 65535

A service subclasses :class:`ServiceSettings` and adds its own fields, with
``Annotated[..., msgspec.Meta(description=...)]`` for the ``--help`` text.
"""

from __future__ import annotations

import argparse
import enum
import os
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import msgspec

from neuron_dra_common.errors import SetupError

__all__ = [
    "ENV_PREFIX",
    "LeaderElectedSettings",
    "NodeHardwareSettings",
    "NodeLivenessSettings",
    "ServiceSettings",
    "SettingsError",
    "env_name",
    "flag_name",
    "load",
    "shown_default",
]

ENV_PREFIX = "NEURON_DRA_"

S = TypeVar("S", bound=msgspec.Struct)


class SettingsError(SetupError):
    """A setting had a bad value; the message names the variable or flag and the expectation."""


class ServiceSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What every service is configured with."""

    #: The settings that carry this service's credentials on the bus: without them it does
    #: not start (:meth:`bus_refusal`) unless ``insecure_bus`` is set. Empty: no bus.
    bus_credentials: ClassVar[tuple[str, ...]] = ("nats_token_file", "nats_tls_ca")

    log_level: Annotated[
        Literal["debug", "info", "warning", "error"], msgspec.Meta(description="Log level")
    ] = "info"
    # Loopback unless the deployment says otherwise: the manifests give a pod its pod IP
    # (downward API), where the kubelet's probes and Prometheus reach it; on the host's
    # network that is the node's address, not every interface of the host.
    http_host: Annotated[
        str,
        msgspec.Meta(
            min_length=1,
            pattern=r"^[0-9A-Za-z.:%_-]+$",
            description="Address the HTTP server (/metrics, /healthz, /readyz) listens on: an "
            "IP address or host name (0.0.0.0: every interface)",
        ),
    ] = "127.0.0.1"
    http_port: Annotated[
        int, msgspec.Meta(ge=0, le=65535, description="Port of the HTTP server (0: any free)")
    ] = 8080
    http_header_timeout: Annotated[
        float,
        msgspec.Meta(
            gt=0, description="Seconds an HTTP request's head may take from its first byte"
        ),
    ] = 10.0
    http_idle_timeout: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="Seconds an HTTP connection may stay without a complete request, from "
            "its start or its last answer, before it is closed",
        ),
    ] = 60.0
    http_request_timeout: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="Seconds allowed for an HTTP request from its head to its answer "
            "(reading its body included)",
        ),
    ] = 30.0
    http_max_connections: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            le=100_000,
            description="HTTP connections served at once; one more is closed when accepted",
        ),
    ] = 100
    nats_servers: Annotated[
        tuple[str, ...], msgspec.Meta(min_length=1, description="NATS URLs, comma-separated")
    ] = ("nats://127.0.0.1:4222",)
    nats_token_file: Annotated[
        str,
        msgspec.Meta(
            description="File holding the token sent to NATS (a projected ServiceAccount "
            "token, read again at every reconnect); empty: none"
        ),
    ] = ""
    nats_tls_ca: Annotated[
        str,
        msgspec.Meta(description="CA bundle that signs the NATS server's certificate; set: TLS"),
    ] = ""
    nats_tls_cert: Annotated[
        str, msgspec.Meta(description="Client certificate for NATS (PEM); empty: none")
    ] = ""
    nats_tls_key: Annotated[
        str, msgspec.Meta(description="Key of the NATS client certificate (PEM)")
    ] = ""
    insecure_bus: Annotated[
        bool,
        msgspec.Meta(
            description="Connect to NATS without a token and without TLS: an open bus anyone "
            "who reaches the server reads and writes; for debugging only, said at start"
        ),
    ] = False
    stream_replicas: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            le=5,
            description="Copies of each JetStream stream: the NATS cluster's size (1, 3 or 5)",
        ),
    ] = 1
    otlp_endpoint: Annotated[
        str, msgspec.Meta(description="OTLP gRPC endpoint for traces; empty: no export")
    ] = ""
    shutdown_timeout: Annotated[
        float, msgspec.Meta(gt=0, description="Seconds allowed for an orderly shutdown")
    ] = 10.0
    bus_max_message_bytes: Annotated[
        int,
        msgspec.Meta(
            ge=1024,
            description="Largest message a consumer accepts, in bytes (1 MiB: NATS's own "
            "max_payload); a larger one goes to the dead letter",
        ),
    ] = 1 << 20
    bus_max_inventory_devices: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            description="Most devices a NodeInventory may list; one with more goes to the dead "
            "letter and makes no ResourceSlices (a host has at most 64 Neuron devices)",
        ),
    ] = 64

    def missing_bus_credentials(self) -> list[str]:
        """The variables of :attr:`bus_credentials` left empty."""
        return [env_name(name) for name in self.bus_credentials if not getattr(self, name)]

    def bus_refusal(self) -> str:
        """Why this service must not start: the bus credentials it lacks; empty: none."""
        missing = self.missing_bus_credentials()
        if self.insecure_bus or not missing:
            return ""
        return (
            f"{' and '.join(missing)} not set: the bus admits only authenticated clients "
            f"over TLS ({env_name('insecure_bus')}=1 connects to an open bus, for debugging "
            "only)"
        )


class LeaderElectedSettings(ServiceSettings, frozen=True, kw_only=True):
    """A cluster service that talks to the API and of whose replicas one works at a time.

    Each service sets its own ``lease_name`` default.
    """

    kubeconfig: Annotated[
        str, msgspec.Meta(description="kubeconfig file; empty: KUBECONFIG, else in-cluster")
    ] = ""
    namespace: Annotated[
        str, msgspec.Meta(min_length=1, description="Namespace of the leader election Lease")
    ] = "neuron-dra-driver"
    identity: Annotated[
        str, msgspec.Meta(description="This replica's name in the Lease; empty: the host name")
    ] = ""
    lease_name: Annotated[str, msgspec.Meta(min_length=1, description="Lease name")] = "neuron-dra"
    lease_seconds: Annotated[
        float, msgspec.Meta(gt=1, description="How long a leader holds the Lease unrenewed")
    ] = 15.0


class NodeHardwareSettings(ServiceSettings, frozen=True, kw_only=True):
    """A per-node agent: which node it runs on and how it reads that node's Neuron hardware.

    Discovery and the kubelet plugin read the same hardware the same way, so they share
    these settings (and their variables).
    """

    node_name: Annotated[
        str, msgspec.Meta(min_length=1, description="This node's Kubernetes name (downward API)")
    ]
    host_root: Annotated[
        str,
        msgspec.Meta(
            description="Root under which the host's /sys, /dev and /opt (the node's logical "
            "core config) are read"
        ),
    ] = "/"
    neuron_ls_command: Annotated[
        tuple[str, ...],
        msgspec.Meta(description="neuron-ls command line, comma-separated; empty: neuron-ls -j"),
    ] = ()
    neuron_ls_path: Annotated[
        str, msgspec.Meta(description="Read neuron-ls -j output from this file instead")
    ] = ""
    instance_type: Annotated[
        str, msgspec.Meta(description="Instance type override; empty: the DMI product name")
    ] = ""
    boot_id_path: Annotated[str, msgspec.Meta(description="File holding the node's boot id")] = (
        "/proc/sys/kernel/random/boot_id"
    )


class NodeLivenessSettings(NodeHardwareSettings, frozen=True, kw_only=True):
    """A node agent that also sends the node's heartbeats (:mod:`neuron_dra_common.liveness`):
    discovery on the nodes the DRA driver serves, the device plugin on the others."""

    liveness_seconds: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            le=60,
            description="Seconds between NodeHeartbeat messages, the cluster failure detector's "
            "sign that the node is alive (it declares a node lost after a few missed)",
        ),
    ] = 1.0
    kubelet_healthz_url: Annotated[
        str,
        msgspec.Meta(
            description="The node's kubelet health endpoint (the kubelet's default is "
            "http://127.0.0.1:10248/healthz); when set, heartbeats stop while it does not "
            "answer ok, so a node whose kubelet died is declared lost; empty: not checked"
        ),
    ] = ""
    heartbeat_mode: Annotated[
        Literal["stream", "ttl"],
        msgspec.Meta(
            description="stream: every heartbeat is a NodeHeartbeat the failure detector "
            "consumes; ttl: a hello, then alive beats the bus keeps for the node's window "
            "(Nats-TTL), which the detector polls once a second (needs a failure detector "
            "that knows ttl mode: update it first)"
        ),
    ] = "stream"


def env_name(field: str, prefix: str = ENV_PREFIX) -> str:
    """The environment variable of a field: ``http_port`` -> ``NEURON_DRA_HTTP_PORT``."""
    return prefix + field.upper()


def flag_name(field: str) -> str:
    """The command-line flag of a field: ``http_port`` -> ``--http-port``."""
    return "--" + field.replace("_", "-")


def _expected(t: msgspec.inspect.Type) -> str:
    if isinstance(t, msgspec.inspect.Metadata):
        return _expected(t.type)
    if isinstance(t, msgspec.inspect.BoolType):
        return "true or false"
    if isinstance(t, msgspec.inspect.LiteralType):
        return "one of " + ", ".join(map(str, t.values))
    if isinstance(t, msgspec.inspect.IntType | msgspec.inspect.FloatType):
        kind = "an integer" if isinstance(t, msgspec.inspect.IntType) else "a number"
        low = t.ge if t.ge is not None else t.gt
        high = t.le if t.le is not None else t.lt
        if low is not None and high is not None:
            return f"{kind} between {low} and {high}"
        if t.gt is not None:
            return f"{kind} greater than {t.gt}"
        if t.ge is not None:
            return f"{kind} of at least {t.ge}"
        return kind
    if isinstance(t, msgspec.inspect.VarTupleType | msgspec.inspect.ListType):
        least = f", at least {t.min_length}" if t.min_length else ""
        item = _base(t.item_type)
        items = "strings" if isinstance(item, msgspec.inspect.StrType) else _expected(item)
        return f"a comma-separated list of {items}{least}"
    if isinstance(t, msgspec.inspect.StrType):
        return "a non-empty string" if t.min_length else "a string"
    if isinstance(t, msgspec.inspect.UnionType):
        return " or ".join(_expected(x) for x in t.types)
    return type(t).__name__.removesuffix("Type").lower()


def _is_sequence(t: msgspec.inspect.Type) -> bool:
    if isinstance(t, msgspec.inspect.Metadata):
        return _is_sequence(t.type)
    return isinstance(t, msgspec.inspect.VarTupleType | msgspec.inspect.ListType)


def shown_default(value: object) -> str:
    """A default as a user would write it in the flag or variable, for ``--help``.

    >>> [shown_default(v) for v in ("info", "", 10.0, 0.5, True, ("a", "b"), ())]
    ['info', 'empty', '10', '0.5', 'true', 'a,b', 'empty']
    """
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple | list | frozenset | set):
        value = ",".join(shown_default(v) for v in value)
    text = str(value)  # a Path prints as the path
    return text if text else "empty"


def _parser(cls: type[msgspec.Struct], fields: Sequence[msgspec.inspect.Field], prog: str) -> Any:
    parser = argparse.ArgumentParser(prog=prog, description=(cls.__doc__ or "").strip() or None)
    for f in fields:
        description = ""
        if isinstance(f.type, msgspec.inspect.Metadata):
            description = str((f.type.extra_json_schema or {}).get("description", ""))
        default = "" if f.required else f" (default: {shown_default(f.default)})"
        parser.add_argument(
            flag_name(f.name),
            dest=f.name,
            default=None,
            metavar=env_name(f.name),
            help=f"{description}; env {env_name(f.name)}{default}",
        )
    return parser


def load(
    cls: type[S],
    *,
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    prog: str | None = None,
) -> S:
    """Build ``cls`` from ``argv`` flags, then ``environ``, then the field defaults.

    Raises :class:`SettingsError` naming the first bad variable; ``--help`` exits as usual.

    >>> load(ServiceSettings, argv=["--http-port", "9000"], environ={}).http_port
    9000
    """
    info = msgspec.inspect.type_info(cls)
    if not isinstance(info, msgspec.inspect.StructType):
        raise TypeError(f"{cls.__name__} is not a msgspec Struct")
    env = os.environ if environ is None else environ
    parsed = _parser(cls, info.fields, prog or cls.__name__).parse_args(
        list(argv) if argv is not None else []
    )
    values: dict[str, Any] = {}
    sources: dict[str, tuple[str, str]] = {}
    for f in info.fields:
        flag_value = getattr(parsed, f.name)
        if flag_value is not None:
            raw, source = flag_value, flag_name(f.name)
        elif env_name(f.name) in env:
            raw, source = env[env_name(f.name)], env_name(f.name)
        else:
            continue
        sources[f.name] = (source, raw)
        if _is_sequence(f.type):
            values[f.name] = [part.strip() for part in raw.split(",") if part.strip()]
        elif isinstance(_base(f.type), msgspec.inspect.BoolType):
            values[f.name] = _bool(raw)
        else:
            values[f.name] = raw
    try:
        return msgspec.convert(values, cls, strict=False)
    except msgspec.ValidationError as exc:
        raise _explain(exc, info, sources) from None


def _base(t: msgspec.inspect.Type) -> msgspec.inspect.Type:
    return t.type if isinstance(t, msgspec.inspect.Metadata) else t


def _bool(raw: str) -> bool | str:
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    return raw  # left as text so validation reports it against the variable


def _explain(
    exc: msgspec.ValidationError,
    info: msgspec.inspect.StructType,
    sources: Mapping[str, tuple[str, str]],
) -> SettingsError:
    text = str(exc)
    if "missing required field `" in text:
        field = text.split("missing required field `", 1)[1].split("`")[0]
    elif "$." in text:
        field = text.rsplit("$.", 1)[1].split("`")[0].split("[")[0]
    else:
        field = ""
    by_name = {f.name: f for f in info.fields}
    if field not in by_name:
        return SettingsError(f"{info.cls.__name__}: {text}")
    f = by_name[field]
    if field in sources:
        source, raw = sources[field]
        return SettingsError(f"{source}={raw!r}: expected {_expected(f.type)}")
    return SettingsError(
        f"{env_name(field)} (or {flag_name(field)}) is required: expected {_expected(f.type)}"
    )
