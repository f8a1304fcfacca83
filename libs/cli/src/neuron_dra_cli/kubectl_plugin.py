"""``kubectl-neuron``: the kubectl plugin (``kubectl neuron explain pod/NAME``).

kubectl finds ``kubectl-neuron`` on PATH and runs it with the words after ``neuron`` and the
same environment (KUBECONFIG). Every ``neuron-dra`` command works this way, e.g.
``kubectl neuron topology show NODE``.
"""

from __future__ import annotations

import sys

from neuron_dra_cli import main as cli

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    return cli.main(list(sys.argv[1:] if argv is None else argv), prog="kubectl neuron")
