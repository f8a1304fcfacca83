"""The CEL functions and types Kubernetes adds to CEL, for cel-cpp (pure): Semver and
Quantity as one proto message ``kubernetes.Opaque{kind, text}`` (cel-cpp registers member
overloads per value kind, so one message type with a kind field is how both types get
``compareTo`` and friends), and the regex, lists and sets libraries."""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any, Final

from cel_expr_python import cel
from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

from neuron_dra_common.explain.celtypes import Semver, parse_quantity, parse_semver

__all__ = ["POOL", "functions", "quantity_value", "semver_value"]

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


POOL, _OPAQUE = _descriptor_pool()


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


def functions() -> list[Any]:
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
