"""The per-node kubelet DRA plugin of neuron.aws.com.

Pure modules (``config``, ``edits``, ``checkpoint``, ``claims``, ``prepare``) hold the logic;
``registration``, ``draservice`` and ``health`` are the gRPC servicers, ``servers`` runs them;
``main`` wires everything.
"""
