"""Names and namespaces checked before they become part of a request's path.

A name reaches the URL of the request; one with ``/``, ``..``, ``%`` or a control character
(CR/LF) would name another object or, unescaped, end the request line. Kubernetes never
stores such names, so a caller that holds one has a bug or was handed hostile input: the
call is refused here, before a byte is sent, with an error naming the field.

>>> check_name("neurondevice0", field="name", kind="ResourceSlice")
'neurondevice0'
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["InvalidName", "check_name", "check_namespace", "check_subresource"]

_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBRESOURCE: Final = re.compile(r"[a-z][a-z0-9]*")
#: A path segment's longest name (a DNS subdomain, the longest name any kind allows).
MAX_NAME: Final = 253


class InvalidName(ValueError):
    """A name or namespace that cannot be part of an API path; says which field and why."""


def _refuse(kind: str, field: str, value: str, why: str) -> InvalidName:
    return InvalidName(f"{kind} {field} {value!r}: {why}")


def check_name(value: str, *, field: str = "name", kind: str = "object") -> str:
    """A name as one path segment (Kubernetes' path-segment rule, and no control or space
    characters, and at most 253 characters); returns it."""
    if not isinstance(value, str) or not value:
        raise _refuse(kind, field, str(value), "is empty")
    if value in (".", ".."):
        raise _refuse(kind, field, value, "may not be '.' or '..'")
    for bad, what in (("/", "'/'"), ("%", "'%'")):
        if bad in value:
            raise _refuse(kind, field, value, f"may not contain {what}")
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        raise _refuse(kind, field, value, "may not contain spaces or control characters")
    if len(value) > MAX_NAME:
        raise _refuse(kind, field, value[:40] + "...", f"is longer than {MAX_NAME} characters")
    return value


def check_namespace(value: str, *, kind: str = "object") -> str:
    """A namespace: a DNS label (lower-case letters, digits, ``-``; at most 63)."""
    if not isinstance(value, str) or not value:
        raise _refuse(kind, "namespace", str(value), "is empty")
    if len(value) > 63 or not _LABEL.fullmatch(value):
        raise _refuse(
            kind,
            "namespace",
            value,
            "is not a DNS label (lower-case letters, digits and '-', at most 63)",
        )
    return value


def check_subresource(value: str, *, kind: str = "object") -> str:
    """A subresource (``status``, ``binding``, ``scale``, ...)."""
    if not _SUBRESOURCE.fullmatch(value or ""):
        raise _refuse(kind, "subresource", str(value), "is not a subresource name")
    return value
