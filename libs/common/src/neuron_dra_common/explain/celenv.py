"""CEL selectors evaluated the way kube-scheduler evaluates them (no I/O).

kube-scheduler compiles DeviceClass and ResourceClaim selectors with cel-go, the
``k8s.io/dynamic-resource-allocation/cel`` environment: a ``device`` variable with ``driver``,
``attributes``, ``capacity`` and ``allowMultipleAllocations``; the apiserver's base libraries
(strings, optional syntax, ``cel.bind``, Semver, Quantity, regex, lists, sets). Here the same
expressions run on cel-cpp (``cel-expr-python``), with Kubernetes' functions from ``cellib``.

Where cel-cpp cannot give cel-go's answer, the result is :class:`CannotEvaluate` with the
reason, never a guess.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import msgspec
from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings

from neuron_dra_common.explain.cellib import POOL, functions, quantity_value, semver_value
from neuron_dra_common.explain.celtypes import parse_quantity, parse_semver

__all__ = ["CannotEvaluate", "CelError", "DeviceValue", "DraCel", "Program", "device_value"]


class CannotEvaluate(msgspec.Struct, frozen=True):
    """Explain's CEL runtime cannot answer as kube-scheduler would; ``why`` says what."""

    why: str


class CelError(msgspec.Struct, frozen=True):
    """The evaluation failed as it fails in kube-scheduler (a missing attribute, say): the
    scheduler then aborts the whole scheduling attempt of the pod."""

    message: str


class Program(msgspec.Struct, frozen=True):
    expression: str
    compiled: Any
    attribute_domains: frozenset[str]
    capacity_domains: frozenset[str]


class DeviceValue(msgspec.Struct, frozen=True):
    """A device as the CEL variable ``device``, built once per device of a slice.

    ``error`` is set when the scheduler cannot even build the variable (an unparsable version
    attribute, a list-typed attribute): every evaluation of the device then fails.
    """

    data: dict[str, Any]
    fingerprint: str
    error: str = ""
    versions: frozenset[str] = frozenset()


# device.attributes / device.capacity are read with a literal domain in practice; anything else
# (a variable index, iteration, `in`) is answered differently by cel-cpp because its maps have
# no default value for an unknown domain, as cel-go's have.
_OUTER = re.compile(r"device\s*\.\s*(attributes|capacity)\b")
_LITERAL_INDEX = re.compile(r"\s*\[\s*(?:'([^'\\]*)'|\"([^\"\\]*)\")\s*\]")
_TWO_VARIABLE = re.compile(
    r"\.\s*(all|exists|existsOne|exists_one|transformList|transformMap|transformMapEntry)"
    r"\(\s*[A-Za-z_]\w*\s*,\s*[A-Za-z_]\w*\s*,"
)
_UNDECLARED = re.compile(r"undeclared reference to '([^']+)'")
_MISSING_KEY = re.compile(r'Key not found in map\s*:\s*"?([^"]*)"?')
_STATUS_PREFIX = re.compile(r"^[A-Z_]+: ")
_VERSION_OPS: Final = "compareTo|isGreaterThan|isLessThan|major|minor|patch"


class DraCel:
    """One CEL environment; compiles each expression once and remembers each device's answer.

    >>> cel_env = DraCel()
    >>> program = cel_env.compile("device.driver == 'neuron.aws.com'")
    >>> dev = device_value(driver="neuron.aws.com", device={"name": "d0"})
    >>> cel_env.matches(program, dev)
    True
    """

    def __init__(self) -> None:
        self._env = cel.NewEnv(
            POOL,
            variables={"device": cel.Type.DYN},
            functions=functions(),
            extensions=[
                ext_bindings.ExtBindings(),
                ext_strings.ExtStrings(2),
                ext_optional.ExtOptional(),
            ],
        )
        self._programs: dict[str, Program | CannotEvaluate] = {}
        self._results: dict[tuple[str, str], bool | CelError | CannotEvaluate] = {}

    def compile(self, expression: str) -> Program | CannotEvaluate:
        found = self._programs.get(expression)
        if found is None:
            found = self._programs[expression] = self._compile(expression)
        return found

    def _compile(self, expression: str) -> Program | CannotEvaluate:
        domains: dict[str, set[str]] = {"attributes": set(), "capacity": set()}
        for match in _OUTER.finditer(expression):
            index = _LITERAL_INDEX.match(expression, match.end())
            if index is None:
                return CannotEvaluate(
                    f"it reads device.{match.group(1)} other than with a literal domain "
                    f'(device.{match.group(1)}["domain"]), which explain\'s CEL runtime cannot '
                    "answer as kube-scheduler does"
                )
            domains[match.group(1)].add(index.group(1) or index.group(2) or "")
        two_variable = _TWO_VARIABLE.search(expression)
        if two_variable:
            return CannotEvaluate(
                f"explain's CEL runtime lacks two-variable comprehensions ({two_variable.group(1)})"
            )
        try:
            compiled = self._env.compile(expression)
        except RuntimeError as exc:
            text = str(exc).splitlines()[0]
            undeclared = _UNDECLARED.search(text)
            if undeclared:
                return CannotEvaluate(f"explain's CEL runtime lacks {undeclared.group(1)}")
            return CannotEvaluate(f"explain's CEL checker rejects it: {_clean(text)}")
        return Program(
            expression=expression,
            compiled=compiled,
            attribute_domains=frozenset(domains["attributes"]),
            capacity_domains=frozenset(domains["capacity"]),
        )

    def matches(self, program: Program, device: DeviceValue) -> bool | CelError | CannotEvaluate:
        """Does ``device`` satisfy ``program``: True, False, the scheduler's error, or
        "cannot evaluate" (a version attribute compared with ``==``, say)."""
        key = (program.expression, device.fingerprint)
        found = self._results.get(key)
        if found is None:
            found = self._results[key] = self._evaluate(program, device)
        return found

    def _evaluate(self, program: Program, device: DeviceValue) -> bool | CelError | CannotEvaluate:
        if device.error:
            return CelError(device.error)
        for name in device.versions:
            if _reads_version_plainly(program.expression, name):
                return CannotEvaluate(
                    f"it reads the version attribute {name} other than through "
                    "compareTo/isGreaterThan/isLessThan/major/minor/patch; explain's CEL "
                    "runtime compares versions with other values differently from kube-scheduler"
                )
        data = _with_domains(device.data, program)
        result = program.compiled.eval(data={"device": data})
        kind = result.type()
        if kind == cel.Type.BOOL:
            return bool(result.value())
        if kind == cel.Type.ERROR:
            return CelError(_clean(str(result.value())))
        return CelError(f"CEL result of type {kind.name()} could not be converted to bool")


def _with_domains(data: dict[str, Any], program: Program) -> dict[str, Any]:
    # cel-go answers an unknown domain with an empty map; cel-cpp has no such default, so the
    # domains the expression names are filled in with empty maps first.
    attrs, caps = data["attributes"], data["capacity"]
    missing_attrs = program.attribute_domains - attrs.keys()
    missing_caps = program.capacity_domains - caps.keys()
    if not missing_attrs and not missing_caps:
        return data
    return {
        **data,
        "attributes": {**attrs, **{key: {} for key in missing_attrs}},
        "capacity": {**caps, **{key: {} for key in missing_caps}},
    }


def _reads_version_plainly(expression: str, name: str) -> bool:
    escaped = re.escape(name)
    access = rf"(?:\.\s*{escaped}\b|\[\s*['\"]{escaped}['\"]\s*\])"
    for match in re.finditer(access, expression):
        if not re.match(rf"\s*\.\s*(?:{_VERSION_OPS})\s*\(", expression[match.end() :]):
            # has(x.version) only tests presence, the same in both runtimes.
            if re.search(r"has\(\s*[^()]*$", expression[: match.start()]):
                continue
            return True
    return False


def _clean(text: str) -> str:
    missing = _MISSING_KEY.search(text)
    if missing:
        return f"no such key: {missing.group(1)}"
    return _STATUS_PREFIX.sub("", text)


def device_value(*, driver: str, device: Mapping[str, Any]) -> DeviceValue:
    """The CEL ``device`` variable for one device of a slice of ``driver`` (as the scheduler's
    ``DeviceMatches`` builds it: unqualified names go to the driver's domain).

    Devices with the same content (chip N of every node of a type, mostly) share one value.
    """
    allow = bool(device.get("allowMultipleAllocations", False))
    fingerprint = msgspec.json.encode(
        [driver, device.get("attributes") or {}, device.get("capacity") or {}, allow],
        order="deterministic",
    ).decode()
    found = _VALUES.get(fingerprint)
    if found is None:
        if len(_VALUES) >= _VALUES_MAX:
            _VALUES.clear()
        found = _VALUES[fingerprint] = _build_value(driver, device, fingerprint, allow)
    return found


_VALUES: dict[str, DeviceValue] = {}
_VALUES_MAX: Final = 50_000


def _build_value(
    driver: str, device: Mapping[str, Any], fingerprint: str, allow: bool
) -> DeviceValue:
    attributes: dict[str, dict[str, Any]] = {}
    capacity: dict[str, dict[str, Any]] = {}
    versions: set[str] = set()
    error = ""
    for qualified, raw in (device.get("attributes") or {}).items():
        domain, ident = _split(qualified, driver)
        value: Any
        if "string" in raw:
            value = raw["string"]
        elif "int" in raw:
            value = raw["int"]
        elif "bool" in raw:
            value = raw["bool"]
        elif "version" in raw:
            versions.add(ident)
            try:
                value = semver_value(parse_semver(raw["version"]))
            except ValueError as exc:
                error = error or f"attribute {qualified}: parse semantic version: {exc}"
                continue
        else:
            error = error or f"attribute {qualified}: unsupported attribute value"
            continue
        attributes.setdefault(domain, {})[ident] = value
    for qualified, raw in (device.get("capacity") or {}).items():
        domain, ident = _split(qualified, driver)
        try:
            capacity.setdefault(domain, {})[ident] = quantity_value(
                parse_quantity(str(raw.get("value", "0")))
            )
        except ValueError as exc:
            error = error or f"capacity {qualified}: {exc}"
    return DeviceValue(
        data={
            "driver": driver,
            "attributes": attributes,
            "capacity": capacity,
            "allowMultipleAllocations": allow,
        },
        fingerprint=fingerprint,
        error=error,
        versions=frozenset(versions),
    )


def _split(qualified: str, driver: str) -> tuple[str, str]:
    domain, slash, ident = qualified.rpartition("/")
    return (domain, ident) if slash else (driver, qualified)
