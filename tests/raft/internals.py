"""The test accessor for the Raft core behind a ``RawNode``.

``RawNode`` keeps its algorithm private: the driver (``coordinator/``) sees only the inputs,
the Ready/advance contract and ``basic_status()``/``status()``. Tests of the algorithm itself
(etcd-io/raft's ``raft_test.go`` style) and the simulator's invariant checks set up and
inspect internals the driver must not: they reach the core through ``raft_core_for_tests``,
so every such reach is one grep away.
"""

from __future__ import annotations

from rallypoint.raft import Raft, RawNode


def raft_core_for_tests(node: RawNode) -> Raft:
    """The ``Raft`` inside ``node``; for tests and the simulator only, never the driver."""
    return node._raft
