"""The README's attack matrix, gathered from every area's rows.

``python -m tests.attacks.matrix`` prints the table; ``--write`` puts it into README.md
between its markers. ``tests/unit/docs/test_attack_matrix.py`` fails when the README and the
rows disagree or a row names a test that does not exist.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import pkgutil
import sys
from pathlib import Path

from tests.attacks import Row

__all__ = ["BEGIN", "END", "README", "all_rows", "missing_tests", "render", "replace_in"]

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
BEGIN = "<!-- attack matrix: python -m tests.attacks.matrix --write -->"
END = "<!-- end of attack matrix -->"


def all_rows() -> list[Row]:
    """Every area's rows (``tests/attacks/rows_*.py``), in area then file order."""
    rows: list[Row] = []
    package = Path(__file__).parent
    for module in sorted(m.name for m in pkgutil.iter_modules([str(package)])):
        if module.startswith("rows_"):
            rows += importlib.import_module(f"tests.attacks.{module}").ROWS
    return rows


def render(rows: list[Row]) -> str:
    """The Markdown table: one line per (identity, action), grouped by identity."""
    lines = ["| identity | action | outcome | proven by |", "|---|---|---|---|"]
    for row in sorted(rows, key=lambda r: (r.identity, r.outcome, r.action)):
        lines.append(f"| {row.identity} | {row.action} | **{row.outcome}** | `{row.test}` |")
    return "\n".join(lines)


def replace_in(text: str, table: str) -> str:
    """``text`` with the table between the markers replaced by ``table``."""
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"README.md lacks the markers {BEGIN!r} ... {END!r}")
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def _defined(path: Path) -> set[str]:
    """``name`` and ``Class::name`` of every test function in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {
                f"{node.name}::{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            }
    return names


def missing_tests(rows: list[Row]) -> list[str]:
    """The rows whose test node id names no test function (parameters are ignored)."""
    missing: list[str] = []
    for row in rows:
        path, _, name = row.test.partition("::")
        file = REPO / path
        if not name or not file.is_file() or name.partition("[")[0] not in _defined(file):
            missing.append(f"{row.identity} / {row.action}: {row.test}")
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update README.md in place")
    args = parser.parse_args(argv)
    table = render(all_rows())
    if args.write:
        README.write_text(replace_in(README.read_text(), table))
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
