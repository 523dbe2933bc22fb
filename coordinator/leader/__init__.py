"""Soft state only the leader keeps, driven by its clock: lease expiry (the lessor), the
rendezvous supervisor, failure detectors (phi accrual) and progress verdicts. Nothing here is
replicated; a new leader rebuilds it from the state machine."""
