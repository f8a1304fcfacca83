"""The README's attack matrix is the rows of tests/attacks, and each row's test exists."""

from __future__ import annotations

import pytest

from tests.attacks import Row
from tests.attacks.matrix import (
    BEGIN,
    END,
    README,
    all_rows,
    missing_tests,
    render,
    replace_in,
)


def test_readme_shows_every_row() -> None:
    rows = all_rows()
    assert rows, "no rows in tests/attacks/rows_*.py"
    text = README.read_text()
    assert replace_in(text, render(rows)) == text, (
        "README.md's attack matrix differs from tests/attacks: "
        "run `python -m tests.attacks.matrix --write`"
    )


def test_every_row_names_a_test_that_exists() -> None:
    assert missing_tests(all_rows()) == []


def test_a_missing_test_is_reported() -> None:
    row = Row("anonymous", "publish", "refused", "tests/unit/docs/test_attack_matrix.py::nope")
    assert missing_tests([row]) == [
        "anonymous / publish: tests/unit/docs/test_attack_matrix.py::nope"
    ]
    assert (
        missing_tests([row._replace(test=f"{row.test[:-6]}::test_a_missing_test_is_reported")])
        == []
    )


def test_replace_needs_the_markers() -> None:
    with pytest.raises(ValueError, match="markers"):
        replace_in("no markers here", "| table |")
    assert replace_in(f"a\n{BEGIN}\nold\n{END}\nb", "new") == f"a\n{BEGIN}\nnew\n{END}\nb"
