"""Kubernetes' two CEL value types that are not CEL built-ins: Semver and Quantity (pure).

Parsing follows what kube-scheduler links: ``blang/semver``'s strict ``Parse`` (and the
apiserver's ``normalizeAndParse`` for ``semver(s, true)``) and ``resource.ParseQuantity``.
Values are kept as exact numbers so that comparisons agree with Go's (``1Gi == 1024Mi``).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Final

import msgspec

__all__ = ["Semver", "parse_quantity", "parse_semver"]

_NUMERIC = re.compile(r"0|[1-9][0-9]*")
_IDENT = re.compile(r"[0-9A-Za-z-]+")


class Semver(msgspec.Struct, frozen=True, order=False):
    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()

    def text(self) -> str:
        """The version without build metadata: two Semvers are equal when their texts are."""
        core = f"{self.major}.{self.minor}.{self.patch}"
        return f"{core}-{'.'.join(self.pre)}" if self.pre else core

    def compare(self, other: Semver) -> int:
        mine = (self.major, self.minor, self.patch)
        theirs = (other.major, other.minor, other.patch)
        if mine != theirs:
            return -1 if mine < theirs else 1
        # A version without pre-release parts is greater than one with them.
        if not self.pre or not other.pre:
            return (not self.pre) - (not other.pre)
        for a, b in zip(self.pre, other.pre, strict=False):
            if a == b:
                continue
            a_num, b_num = a.isdigit(), b.isdigit()
            if a_num and b_num:
                return -1 if int(a) < int(b) else 1
            if a_num != b_num:
                return -1 if a_num else 1
            return -1 if a < b else 1
        return (len(self.pre) > len(other.pre)) - (len(self.pre) < len(other.pre))


def parse_semver(text: str, *, normalize: bool = False) -> Semver:
    """A strict SemVer 2.0 version; ``normalize`` accepts ``v1``, ``1.2`` and leading zeros.

    >>> parse_semver("2.24.7").text(), parse_semver("v1.02", normalize=True).text()
    ('2.24.7', '1.2.0')
    """
    if normalize:
        text = _normalize(text)
    if not text:
        raise ValueError("Version string empty")
    rest, _, build = text.partition("+")
    core, dash, pre_text = rest.partition("-")
    parts = core.split(".")
    if len(parts) != 3:
        raise ValueError("No Major.Minor.Patch elements found")
    numbers: list[int] = []
    for label, part in zip(("Major", "Minor", "Patch"), parts, strict=True):
        if not part.isdigit() or not part.isascii():
            raise ValueError(f"Invalid character(s) found in {label.lower()} number {part!r}")
        if not _NUMERIC.fullmatch(part):
            raise ValueError(f"{label} number must not contain leading zeroes {part!r}")
        numbers.append(int(part))
    pre: tuple[str, ...] = ()
    if dash:
        pre = tuple(pre_text.split("."))
        for ident in pre:
            if not _IDENT.fullmatch(ident):
                raise ValueError(f"Invalid character(s) found in prerelease {ident!r}")
            if ident.isdigit() and not _NUMERIC.fullmatch(ident):
                raise ValueError(
                    f"Numeric PreRelease version must not contain leading zeroes {ident!r}"
                )
    if build and not all(_IDENT.fullmatch(b) for b in build.split(".")):
        raise ValueError(f"Invalid character(s) found in build meta data {build!r}")
    return Semver(numbers[0], numbers[1], numbers[2], pre)


def _normalize(text: str) -> str:
    text = text.removeprefix("v")
    parts = text.split(".", 2)
    for i, part in enumerate(parts):
        if len(part) > 1:
            part = part.lstrip("0")
            if not part or not part[0].isdigit():
                part = "0" + part
            parts[i] = part
    if len(parts) < 3:
        if any(c in parts[-1] for c in "+-"):
            raise ValueError("short version cannot contain PreRelease/Build meta data")
        parts += ["0"] * (3 - len(parts))
    return ".".join(parts)


_BINARY: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL: Final = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_QUANTITY = re.compile(r"([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(.*)")


def parse_quantity(text: str) -> Fraction:
    """A Kubernetes quantity (``96Gi``, ``500m``, ``1e3``) as an exact number.

    >>> parse_quantity("1Gi") == parse_quantity("1024Mi"), parse_quantity("1500m")
    (True, Fraction(3, 2))
    """
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(
            "quantities must match the regular expression "
            r"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        )
    sign, number, suffix = match.groups()
    value = Fraction(number)
    if suffix in _BINARY:
        value *= 2 ** _BINARY[suffix]
    elif suffix in _DECIMAL:
        value *= Fraction(10) ** _DECIMAL[suffix]
    elif re.fullmatch(r"[eE][+-]?[0-9]+", suffix):
        value *= Fraction(10) ** int(suffix[1:])
    else:
        raise ValueError(f"unable to parse quantity's suffix {suffix!r}")
    return -value if sign == "-" else value
