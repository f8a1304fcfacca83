"""The attack matrix: which identity may do what, each row proven by a test.

Every area keeps its rows in ``tests/attacks/rows_<area>.py`` as ``ROWS: tuple[Row, ...]``;
``tests/attacks/matrix.py`` gathers them, renders the README's table and checks that each
row's test exists. A row says what the test asserts: ``refused`` means the attempt fails with
a visible refusal (an error to the client, an audit line or a metric) and leaves nothing
changed; ``allowed`` means the identity's own, legitimate action still works.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

__all__ = ["Outcome", "Row"]

Outcome = Literal["allowed", "refused"]


class Row(NamedTuple):
    """One cell of the matrix and the test that proves it."""

    #: Who attempts it, with the credentials that identity really has, e.g. ``anonymous``,
    #: ``discovery of node A``, ``failure-detector``, ``pod in another namespace``.
    identity: str
    #: What is attempted, in a user's words, e.g. ``publish node B's inventory``.
    action: str
    outcome: Outcome
    #: The pytest node id of the test asserting it, e.g.
    #: ``tests/integration/busauth/test_attacks.py::test_forged_inventory``.
    test: str
