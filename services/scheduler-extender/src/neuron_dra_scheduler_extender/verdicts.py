"""Each node's verdict per kind of request, kept until the node or its allocations change.

kube-scheduler asks the filter about every node for every pod, and prioritize about every
node that fits, yet one bind changes one node: nearly every verdict asked for was given
before. A table per kind of request (resource and count) keeps, per node, the verdict and
the view of the node it was made from.

A lookup first makes again the verdicts of the nodes whose allocations the ledger changed
since the table's last lookup (the ledger names them: no node is asked for its stamp), each
from the view it was made from. Then it reads the verdicts and views the table holds for the
names asked, in C (``map`` over the dicts, lists compared element by element, each first by
identity): when every name is held and the views read are the views given, that is the
answer, with no Python step per node. Only a node the table does not hold, or whose view
changed, sends the lookup through the nodes one by one, making afresh just those verdicts.

What is made afresh is exactly what an uncached extender answers: the table changes how
fast, never what.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

from neuron_dra_scheduler_extender.api import HostPriority, NodeView
from neuron_dra_scheduler_extender.decide import Unfit
from neuron_dra_scheduler_extender.inputs import Ask
from neuron_dra_scheduler_extender.ledger import Ledger

__all__ = ["Verdict", "Verdicts"]

#: Why the node cannot serve the request (None: it can), and prioritize's answer for it
#: (score 0 when it cannot).
Verdict = tuple[Unfit | None, HostPriority]

#: Kinds of request kept at most (the least recently asked is forgotten first).
_MAX_KINDS = 32
#: Nodes kept per kind at most (then the kind's table starts again empty): more than a
#: cluster has, so only names of nodes long gone fill it.
_MAX_NODES = 10_000


class _Table:
    __slots__ = ("clock", "verdicts", "views")

    def __init__(self, clock: int) -> None:
        # The ledger's clock at the last lookup: the verdicts are valid as of then.
        self.clock = clock
        # Per node name, the same keys in both: the verdict, and the view it was made from.
        self.verdicts: dict[str, Verdict] = {}
        self.views: dict[str, NodeView | None] = {}


class Verdicts:
    """The verdicts of ``fresh`` for any (request, node, view), kept per kind of request
    until the ledger changes the node's allocations or the node's view changes."""

    def __init__(
        self, ledger: Ledger, fresh: Callable[[Ask, str, NodeView | None], Verdict]
    ) -> None:
        self._ledger = ledger
        self._fresh = fresh
        self._tables: dict[tuple[str, int], _Table] = {}

    def _table(self, ask: Ask) -> _Table:
        key = (ask.resource, ask.count)
        clock = self._ledger.clock
        table = self._tables.pop(key, None)
        if table is None:
            table = _Table(clock)
        elif table.clock != clock:
            changed = self._ledger.changed_since(table.clock)
            if changed is None or len(table.views) > _MAX_NODES:
                table.verdicts.clear()
                table.views.clear()
            else:
                views = table.views
                for name in changed:
                    if name in views:
                        table.verdicts[name] = self._fresh(ask, name, views[name])
            table.clock = clock
        # Re-inserted: the dict's order is the order of last use.
        self._tables[key] = table
        if len(self._tables) > _MAX_KINDS:
            del self._tables[next(iter(self._tables))]
        return table

    def lookup(
        self, ask: Ask, names: Sequence[str], views: Sequence[NodeView | None]
    ) -> list[Verdict]:
        """The verdict of ``ask`` on each node ``names[i]``, seen as ``views[i]``."""
        table = self._table(ask)
        known, seen = table.verdicts, table.views
        # Both read in C; the views compared element by element in C, each first by identity.
        out: list[Verdict | None] = list(map(known.get, names))
        if None not in out and list(map(seen.get, names)) == list(views):
            return cast("list[Verdict]", out)
        fresh = self._fresh
        for i, (name, view) in enumerate(zip(names, views, strict=True)):
            if out[i] is not None:
                was = seen[name]
                if was is view or was == view:
                    continue
            verdict = fresh(ask, name, view)
            known[name] = verdict
            seen[name] = view
            out[i] = verdict
        return cast("list[Verdict]", out)
