"""Hypothesis strategies for JSON as users and the API hand it over: any value, or a known
object with a few of its fields removed or given other values."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import strategies as st

__all__ = ["json_values", "spoiled"]

json_values: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-10, 10)
    | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON value (keys and indices)."""
    out = [prefix]
    if isinstance(value, dict):
        for key, inner in value.items():
            out += _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            out += _paths(inner, (*prefix, index))
    return out


@st.composite
def spoiled(draw: st.DrawFn, obj: dict[str, Any], *, most: int = 3) -> dict[str, Any]:
    """``obj`` with up to ``most`` of its fields removed or given other values."""
    obj = msgspec.json.decode(msgspec.json.encode(obj))  # a deep copy
    for _ in range(draw(st.integers(0, most))):
        paths = [p for p in _paths(obj) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = obj
        for step in path[:-1]:
            parent = parent[step]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(json_values)
    return obj
