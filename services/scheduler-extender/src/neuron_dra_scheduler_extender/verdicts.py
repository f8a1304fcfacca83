"""Each node's verdict per kind of request, kept until the node or its allocations change.

kube-scheduler asks the filter about every node for every pod, and prioritize about every
node that fits, yet one bind changes one node: nearly every verdict asked for was given
before. A table per kind of request (resource and count) keeps, per node, the verdict and
the view of the node it was made from. A lookup first forgets the nodes whose allocations
the ledger changed since the table's last lookup (the ledger names them: no node is asked
for its stamp), then makes afresh only the verdicts of nodes the table does not hold or
whose view is another than the one it was made from. What is made afresh is exactly what
an uncached extender would answer, so the table changes how fast, never what.

The scheduler mostly asks about the same nodes again (every node to filter, the same fitting
ones to prioritize), so a table also remembers its last answers to the last lists of nodes:
asked about the same names seen as the same views, it answers from there, making afresh only
the verdicts of the nodes the ledger changed since, with no step per unchanged node.
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
#: Lists of nodes whose last answer a table remembers (filter's and prioritize's).
_MAX_ANSWERS = 2


class _Answer:
    """The verdicts given for ``names`` seen as ``views``, valid as of the ledger's ``clock``."""

    __slots__ = ("clock", "index", "names", "verdicts", "views")

    def __init__(
        self,
        *,
        clock: int,
        names: list[str],
        views: list[NodeView | None],
        verdicts: list[Verdict],
    ) -> None:
        self.clock = clock
        self.names = names
        self.views = views
        self.verdicts = verdicts
        self.index = {name: i for i, name in enumerate(names)}


class _Table:
    __slots__ = ("answers", "clock", "entries")

    def __init__(self, clock: int) -> None:
        # The ledger's clock at the last lookup: the entries are valid as of then.
        self.clock = clock
        self.entries: dict[str, tuple[NodeView | None, Verdict]] = {}
        # The most recent first.
        self.answers: list[_Answer] = []


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
                table.answers.clear()
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
        table = self._table(ask)
        names, views = list(names), list(views)
        for answer in table.answers:
            # Compared element by element in C, each first by identity: no step per node.
            if answer.names == names and answer.views == views:
                again = self._again(table, answer, ask)
                if again is not None:
                    return again
                break
        entries = table.entries
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
        answer = _Answer(clock=self._ledger.clock, names=names, views=views, verdicts=out)
        if len(answer.index) == len(names):  # a name twice would need two places updated
            table.answers = [answer, *(a for a in table.answers if a.names != names)]
            del table.answers[_MAX_ANSWERS:]
        return list(out)

    def _again(self, table: _Table, answer: _Answer, ask: Ask) -> list[Verdict] | None:
        """``answer`` brought up to date: the verdicts of the nodes changed since made again,
        or None when the ledger can no longer tell which changed."""
        changed = self._ledger.changed_since(answer.clock)
        if changed is None:
            return None
        entries, verdicts = table.entries, answer.verdicts
        for name in changed:
            i = answer.index.get(name)
            if i is None:
                continue
            view = answer.views[i]
            hit = entries.get(name)
            if hit is not None and (hit[0] is view or hit[0] == view):
                verdicts[i] = hit[1]
            else:
                verdicts[i] = self._fresh(ask, name, view)
                entries[name] = (view, verdicts[i])
        answer.clock = self._ledger.clock
        return list(verdicts)
