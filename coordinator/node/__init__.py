"""A running member: the asyncio driver around the pure Raft core, split by seam.

The parts, each a module (etcd's ``etcdserver/raft.go`` beside ``raft/rawnode.go``, its
``pkg/wait`` and ``server.go``):

- ``driver``: the lifecycle (start, stop), the Ready loop and the apply path, the timers,
  and the face the servicers see (``api.ServerNode``). It only drives: the parts below own
  their state, and callers reach them directly (``Node.membership``, ``Node.liveness``...);
- ``peer_face``: what the peer service and the peer transport see of this member (stepping
  peers' messages, Hello answers, validating entries and snapshots a peer sends);
- ``api``: the contract between the member and the servicers, and the outcomes a member
  reports instead of an answer (``NodeError`` and its subclasses);
- ``config``: what a member runs with;
- ``bootstrap``: a member's first start (create the cluster, or abstain until caught up);
- ``proposals``: entry framing, proposal ids unique per boot, and the waiters that answer
  a caller when its entry applies;
- ``reads``: the ReadIndex batcher and the leader lease behind linearizable reads;
- ``membership``: the Raft configuration and the changes an operator asks for (the
  addresses themselves are ``coordinator/member_table.py``'s);
- ``snapshots``: periodic snapshots and snapshots for followers, encoded off the loop.

The clock-driven soft state lives beside this package: ``coordinator/leader`` (lease expiry
and the rendezvous duties only the leader performs) and ``coordinator/liveness`` (the
failure detectors every member runs for the heartbeat streams it serves).

Nothing is imported here: the servicers import ``api`` (the contract) without loading the
driver and everything it runs; the daemon imports ``driver.Node`` and ``config.NodeConfig``.
"""
