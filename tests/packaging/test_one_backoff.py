"""One backoff policy in the whole tree (client/backoff.py): every retry loop of the client,
the coordinator and the worker takes a ``Backoff`` with its own parameters, and none draws
its own jitter or doubles its own delays. Read from the source, so a new hand-written
backoff fails here; the parameters each site had before are pinned, so none drifted."""

from __future__ import annotations

import ast

from .layout import ROOT

POLICY = ROOT / "client" / "backoff.py"


def test_only_the_client_policy_draws_jitter() -> None:
    drawing = []
    for folder in ("raft", "coordinator", "client", "worker"):
        for source in sorted((ROOT / folder).rglob("*.py")):
            if source == POLICY or "_pb2" in source.name:
                continue
            for node in ast.walk(ast.parse(source.read_text())):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in {"uniform", "expovariate", "random"}
                ):
                    drawing.append(f"{source.relative_to(ROOT)}:{node.lineno}")
    assert drawing == []


def test_each_retry_loop_keeps_its_parameters() -> None:
    from rallypoint.client import Backoff
    from rallypoint.coordinator import transport
    from rallypoint.worker import patience

    in_use = [transport.RECONNECT_BACKOFF, transport.SNAPSHOT_BACKOFF, patience.ATTEMPT_PACING]
    assert in_use == [
        Backoff(base_s=0.05, cap_s=0.5),
        Backoff(base_s=0.1, cap_s=1.0),
        Backoff(base_s=1.0, cap_s=1.0, jitter=False),
    ]
