"""A protocol fuzzer for both ports of a real cluster (``python -m tests.fuzz``).

Every RPC of the public API and of the peer service is fed generated and mutated requests
in three modes: outsiders (no token, no secret: all refused), clients with the token (only
statuses a client can act on), and an insider that signs with the cluster's secret but sends
only malformed content. Raft does not defend against a member that lies in well-formed
messages, and neither does rallypoint (docs/security.md, "Security"): the insider never sends one.
Afterwards the cluster must be whole: members running, a leader taking writes, members
agreeing, before and after each restarts from its own disk.

- ``wire.py``: requests built field by field from the protobuf descriptors (hypothesis
  strategies), and byte-level mutations;
- ``rpcs.py``: the RPCs, enumerated from the descriptors, and a raw call;
- ``public.py``, ``peer.py``: the targets of each mode and how their answers are judged;
- ``raft_messages.py``: malformed Raft messages and snapshots, and what is wrong with them;
- ``checks.py``: the checks afterwards; ``runner.py``: the run; ``__main__.py``: the CLI.
"""
