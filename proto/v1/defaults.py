"""The documented defaults of ``rallypoint.v1.JobConfig`` (rendezvous.proto), in one place.

Both ``JobConfig`` classes take their defaults from :data:`JOB_CONFIG`: the client's
(``client/rendezvous_values.py``, which fills every field it sends) and the state machine's
(``coordinator/state/jobs.py``, which keeps factors in thousandths). ``rendezvous.proto``
states each default in a trailing ``// default <value>`` comment on its field, and
``tests/proto/test_job_config_defaults.py`` checks those comments, this table and both classes
agree. So a default changes here and in that comment, nowhere else; but the state machine's
defaults are also what log entries written before a field existed read as (see
``coordinator/state/codec.py``), so ``tests/golden/records.json`` pins them: those never
change, and a new behaviour gets a new field.

This module imports nothing: it is part of the wire contract, below the client and the
coordinator alike. Units are the wire's: ``phi_threshold``, ``hang_factor`` and
``straggler_factor`` are plain numbers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class JobConfigDefaults:
    """Every JobConfig field but the required ``min_nodes`` and ``max_nodes``."""

    last_call_ms: int = 0
    join_timeout_ms: int = 600_000
    heartbeat_interval_ms: int = 100
    phi_threshold: float = 8.0
    phi_window: int = 100
    min_std_ms: int = 50
    acceptable_pause_ms: int = 0
    scale_up: bool = False
    keep_checkpoints: int = 3
    hang_factor: float = 2.5
    hang_floor_ms: int = 1500
    startup_timeout_ms: int = 60_000
    straggler_factor: float = 0.0
    straggler_windows: int = 3
    straggler_window_ms: int = 10_000


JOB_CONFIG = JobConfigDefaults()

#: The fields a JobConfig must be given (they have no default).
JOB_CONFIG_REQUIRED = ("min_nodes", "max_nodes")


def milli(factor: float) -> int:
    """A factor in thousandths, as the state machine keeps it (8.0 -> 8000)."""
    return round(factor * 1000)
