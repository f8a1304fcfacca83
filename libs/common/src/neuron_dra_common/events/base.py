"""The base every event shares, and how names become subject tokens."""

from __future__ import annotations

import re

import msgspec

__all__ = ["SUBJECT_ROOT", "Event", "check_node_name", "subject_token"]

#: Every subject the product publishes starts with this token.
SUBJECT_ROOT = "neuron"

_UNSAFE = re.compile(r"[.\s*>]")
#: A Kubernetes node name: a DNS-1123 subdomain (lower-case labels of letters, digits and
#: ``-``, joined by ``.``, at most 253 characters).
_DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_MAX_NODE_NAME = 253


def check_node_name(name: str, *, field: str = "node") -> str:
    """``name`` if it is a DNS-1123 subdomain, as every Kubernetes node name is; else a
    ``ValueError`` naming ``field``.

    Only such names reach :func:`subject_token`, where ``.`` becomes ``_``: since ``_`` is
    not allowed, two node names can never share one subject token (``a.b`` and ``a_b``).

    >>> check_node_name("ip-10-0-0-1.ec2.internal")
    'ip-10-0-0-1.ec2.internal'
    """
    if len(name) > _MAX_NODE_NAME or not _DNS_1123_SUBDOMAIN.fullmatch(name):
        raise ValueError(
            f"{field} {name[: _MAX_NODE_NAME + 1]!r} is not a node name (a DNS-1123 subdomain: "
            f"lower-case letters, digits, '-' and '.', at most {_MAX_NODE_NAME} characters)"
        )
    return name


def subject_token(name: str) -> str:
    """Turn a Kubernetes name into one NATS subject token.

    Kubernetes names never contain ``_``, so mapping ``.`` to ``_`` cannot make two names
    collide, and node names such as ``ip-10-0-0-1.ec2.internal`` stay one token.

    >>> subject_token("ip-10-0-0-1.ec2.internal")
    'ip-10-0-0-1_ec2_internal'
    """
    token = _TOKENS.get(name)
    if token is None:
        if not name:
            raise ValueError("subject token: name is empty")
        token = _UNSAFE.sub("_", name)
        if len(_TOKENS) < _TOKENS_KEPT:
            _TOKENS[name] = token
    return token


#: Tokens of names seen before (node and device names repeat on every event), up to a bound.
_TOKENS: dict[str, str] = {}
_TOKENS_KEPT = 65_536


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of every event: frozen, keyword-only, tagged by ``type`` in the payload.

    The tag carries the version (``node.inventory.v1``). A version evolves in place only by
    adding fields with defaults; anything else is a new tag.
    """

    @property
    def subject(self) -> str:
        """The NATS subject the event is published on."""
        raise NotImplementedError(f"{type(self).__name__}: no subject defined")

    @property
    def ce_subject(self) -> str:
        """The CloudEvents ``subject`` attribute: the object the event is about."""
        raise NotImplementedError(f"{type(self).__name__}: no ce subject defined")

    @classmethod
    def event_type(cls) -> str:
        """The tag, e.g. ``node.inventory.v1``."""
        tag = cls.__struct_config__.tag
        if not isinstance(tag, str):
            raise TypeError(f"{cls.__name__}: event tag must be a string, got {tag!r}")
        return tag
