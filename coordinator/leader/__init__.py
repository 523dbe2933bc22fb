"""Soft state driven by the leader's clock: nothing here is replicated, and a new leader
rebuilds it from the state machine.

- ``lessor``: lease deadlines (the leader proposes the expiry of a lease it stopped hearing);
- ``supervisor``: the rendezvous duties that depend on time. Its leader half closes rounds
  whose last call passed, turns the members' suspicions into ``MemberFailed`` proposals
  (``liveness/coverage.py``) and judges training progress (``liveness/progress.py``); its
  member half, which every member runs, drives that member's failure detectors
  (``coordinator/liveness``) and reports to the leader.

The failure detectors themselves (phi accrual, progress reports) are not here: every member
runs them for the heartbeat streams it serves (``coordinator/liveness``)."""
