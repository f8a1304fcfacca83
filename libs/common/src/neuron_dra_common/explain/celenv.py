"""CEL selectors evaluated the way kube-scheduler evaluates them (no I/O).

kube-scheduler compiles DeviceClass and ResourceClaim selectors with cel-go, the
``k8s.io/dynamic-resource-allocation/cel`` environment: a ``device`` variable with ``driver``,
``attributes``, ``capacity`` and ``allowMultipleAllocations``; the apiserver's base libraries
(strings, optional syntax, ``cel.bind``, Semver, Quantity, regex, lists, sets). Here the same
expressions run on cel-cpp (``cel-expr-python``). Semver and Quantity are one proto message,
``kubernetes.Opaque{kind, text}``: cel-cpp registers member overloads per value kind, so one
message type with a kind field is how both types get ``compareTo`` and friends.

Where cel-cpp cannot give cel-go's answer, the result is :class:`CannotEvaluate` with the
reason, never a guess.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any, Final

import msgspec
from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings
from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

from neuron_dra_common.explain.celtypes import Semver, parse_quantity, parse_semver

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


_INT64_MAX: Final = 2**63 - 1


def _descriptor_pool() -> tuple[descriptor_pool.DescriptorPool, Callable[..., message.Message]]:
    proto = descriptor_pb2.FileDescriptorProto(
        name="neuron_dra_explain_cel.proto", package="kubernetes", syntax="proto3"
    )
    opaque = proto.message_type.add(name="Opaque")
    for number, field in enumerate(("kind", "text"), 1):
        opaque.field.add(
            name=field,
            number=number,
            type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
            label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
        )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return pool, message_factory.GetMessageClass(pool.FindMessageTypeByName("kubernetes.Opaque"))


_POOL, _OPAQUE = _descriptor_pool()


def semver_value(version: Semver) -> message.Message:
    return _OPAQUE(kind="semver", text=version.text())


def quantity_value(value: Fraction) -> message.Message:
    return _OPAQUE(kind="quantity", text=str(value))


def _semver(value: Any) -> Semver:
    if value.kind != "semver":
        raise TypeError(f"no such overload: {value.kind} is not a semver")
    return parse_semver(value.text)


def _quantity(value: Any) -> Fraction:
    if value.kind != "quantity":
        raise TypeError(f"no such overload: {value.kind} is not a quantity")
    return Fraction(value.text)


def _compare(a: Any, b: Any) -> int:
    if a.kind != b.kind:
        raise TypeError(f"no such overload: {a.kind}.compareTo({b.kind})")
    if a.kind == "semver":
        return _semver(a).compare(_semver(b))
    x, y = _quantity(a), _quantity(b)
    return (x > y) - (x < y)


def _as_integer(value: Any) -> int:
    number = _quantity(value)
    if number.denominator != 1 or abs(number) > _INT64_MAX:
        raise ValueError("cannot convert value to integer")
    return int(number)


def _is_semver(text: str, normalize: bool = False) -> bool:
    try:
        parse_semver(text, normalize=normalize)
    except ValueError:
        return False
    return True


def _is_quantity(text: str) -> bool:
    try:
        parse_quantity(text)
    except ValueError:
        return False
    return True


def _checked(fn: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
    def call(items: list[Any]) -> Any:
        if not items:
            raise ValueError(f"{fn.__name__} called on empty list")
        return fn(items)

    return call


def _functions() -> list[Any]:
    opaque = cel.Type("kubernetes.Opaque")
    s, b, i, d = cel.Type.STRING, cel.Type.BOOL, cel.Type.INT, cel.Type.DOUBLE
    dyn, any_list = cel.Type.DYN, cel.Type.List(cel.Type.DYN)

    def fn(name: str, *overloads: tuple[str, Any, list[Any], bool, Callable[..., Any]]) -> Any:
        return cel.FunctionDecl(
            name,
            [
                cel.Overload(oid, ret, params, is_member=member, impl=impl)
                for oid, ret, params, member, impl in overloads
            ],
        )

    def member(oid: str, ret: Any, params: list[Any], impl: Callable[..., Any]) -> Any:
        return (oid, ret, params, True, impl)

    def glob(oid: str, ret: Any, params: list[Any], impl: Callable[..., Any]) -> Any:
        return (oid, ret, params, False, impl)

    # indexOf/lastIndexOf on lists (the k8s lists library) are left out: cel-cpp's strings
    # extension declares indexOf already, and a second declaration is refused; such selectors
    # are answered "cannot evaluate".
    return [
        fn(
            "semver",
            glob("string_to_semver", opaque, [s], lambda t: semver_value(parse_semver(t))),
            glob(
                "string_bool_to_semver",
                opaque,
                [s, b],
                lambda t, n: semver_value(parse_semver(t, normalize=n)),
            ),
        ),
        fn(
            "isSemver",
            glob("is_semver_string", b, [s], _is_semver),
            glob("is_semver_string_bool", b, [s, b], _is_semver),
        ),
        fn(
            "quantity",
            glob("string_to_quantity", opaque, [s], lambda t: quantity_value(parse_quantity(t))),
        ),
        fn("isQuantity", glob("is_quantity_string", b, [s], _is_quantity)),
        fn("compareTo", member("opaque_compare_to", i, [opaque, opaque], _compare)),
        fn(
            "isGreaterThan",
            member("opaque_is_greater_than", b, [opaque, opaque], lambda x, y: _compare(x, y) > 0),
        ),
        fn(
            "isLessThan",
            member("opaque_is_less_than", b, [opaque, opaque], lambda x, y: _compare(x, y) < 0),
        ),
        fn("major", member("semver_major", i, [opaque], lambda v: _semver(v).major)),
        fn("minor", member("semver_minor", i, [opaque], lambda v: _semver(v).minor)),
        fn("patch", member("semver_patch", i, [opaque], lambda v: _semver(v).patch)),
        fn(
            "sign",
            member("quantity_sign", i, [opaque], lambda v: (_quantity(v) > 0) - (_quantity(v) < 0)),
        ),
        fn(
            "isInteger",
            member("quantity_is_integer", b, [opaque], lambda v: _quantity(v).denominator == 1),
        ),
        fn("asInteger", member("quantity_as_integer", i, [opaque], _as_integer)),
        fn(
            "asApproximateFloat",
            member("quantity_as_float", d, [opaque], lambda v: float(_quantity(v))),
        ),
        fn(
            "add",
            member(
                "quantity_add",
                opaque,
                [opaque, opaque],
                lambda x, y: quantity_value(_quantity(x) + _quantity(y)),
            ),
            member(
                "quantity_add_int",
                opaque,
                [opaque, i],
                lambda x, y: quantity_value(_quantity(x) + y),
            ),
        ),
        fn(
            "sub",
            member(
                "quantity_sub",
                opaque,
                [opaque, opaque],
                lambda x, y: quantity_value(_quantity(x) - _quantity(y)),
            ),
            member(
                "quantity_sub_int",
                opaque,
                [opaque, i],
                lambda x, y: quantity_value(_quantity(x) - y),
            ),
        ),
        fn(
            "find",
            member(
                "string_find_n",
                s,
                [s, s],
                lambda t, r: m.group(0) if (m := re.search(r, t)) else "",
            ),
        ),
        fn(
            "findAll",
            member(
                "string_find_all",
                cel.Type.List(s),
                [s, s],
                lambda t, r: [m.group(0) for m in re.finditer(r, t)],
            ),
            member(
                "string_find_all_n",
                cel.Type.List(s),
                [s, s, i],
                lambda t, r, n: [m.group(0) for m in re.finditer(r, t)][: n if n >= 0 else None],
            ),
        ),
        fn("isSorted", member("list_is_sorted", b, [any_list], lambda x: list(x) == sorted(x))),
        fn("sum", member("list_sum", dyn, [any_list], lambda x: sum(x))),
        fn("min", member("list_min", dyn, [any_list], _checked(min))),
        fn("max", member("list_max", dyn, [any_list], _checked(max))),
        fn(
            "sets.contains",
            glob(
                "list_sets_contains_list",
                b,
                [any_list, any_list],
                lambda x, y: all(v in x for v in y),
            ),
        ),
        fn(
            "sets.equivalent",
            glob(
                "list_sets_equivalent_list",
                b,
                [any_list, any_list],
                lambda x, y: all(v in x for v in y) and all(v in y for v in x),
            ),
        ),
        fn(
            "sets.intersects",
            glob(
                "list_sets_intersects_list",
                b,
                [any_list, any_list],
                lambda x, y: any(v in x for v in y),
            ),
        ),
    ]


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
            _POOL,
            variables={"device": cel.Type.DYN},
            functions=_functions(),
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
