"""Each node's verdict per kind of request, kept until the node or its allocations change.

kube-scheduler asks the filter about every node for every pod, and prioritize about every
node that fits, yet one bind changes one node: nearly every verdict asked for was given
before. A table per kind of request (resource and count) keeps, per node, the verdict and
the view of the node it was made from. A lookup first forgets the nodes whose allocations
the ledger changed since the table's last lookup (the ledger names them: no node is asked
for its stamp), then makes afresh only the verdicts of nodes the table does not hold or
whose view is another than the one it was made from. What is made afresh is exactly what
an uncached extender would answer, so the table changes how fast, never what.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from neuron_dra_scheduler_extender.api import NodeView
from neuron_dra_scheduler_extender.decide import Unfit
from neuron_dra_scheduler_extender.inputs import Ask
from neuron_dra_scheduler_extender.ledger import Ledger

__all__ = ["Verdict", "Verdicts"]

#: Why the node cannot serve the request (None: it can), and its score for it (0 when not).
Verdict = tuple[Unfit | None, int]

#: Kinds of request kept at most (the least recently asked is forgotten first).
_MAX_KINDS = 32
#: Nodes kept per kind at most (then the kind's table starts again empty): more than a
#: cluster has, so only names of nodes long gone fill it.
_MAX_NODES = 10_000


class _Table:
    __slots__ = ("clock", "entries")

    def __init__(self, clock: int) -> None:
        # The ledger's clock at the last lookup: the entries are valid as of then.
        self.clock = clock
        self.entries: dict[str, tuple[NodeView | None, Verdict]] = {}


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
            if changed is None or len(table.entries) > _MAX_NODES:
                table.entries.clear()
            else:
                for name in changed:
                    table.entries.pop(name, None)
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
        entries = self._table(ask).entries
        fresh = self._fresh
        out: list[Verdict] = []
        append = out.append
        # One pass with locals only: this loop runs for every node on every call.
        for name, view in zip(names, views, strict=True):
            hit = entries.get(name)
            if hit is not None and (hit[0] is view or hit[0] == view):
                append(hit[1])
                continue
            verdict = fresh(ask, name, view)
            entries[name] = (view, verdict)
            append(verdict)
        return out
