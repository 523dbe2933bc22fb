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

This module imports nothing of ours: it is part of the wire contract, below the client and the
coordinator alike. Units are the wire's: ``phi_threshold``, ``hang_factor`` and
``straggler_factor`` are plain numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


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
    # Shape: ranks per unit (world sizes are multiples of it), participants a full failure
    # domain holds (0: not declared), and whether a unit may straddle domains.
    unit_size: int = 1
    domain_size: int = 0
    units_within_domains: bool = False
    # How many straggler windows a rank evicted as a straggler is held out of the job.
    straggler_hold_windows: int = 10


JOB_CONFIG = JobConfigDefaults()

#: The fields a JobConfig must be given (they have no default).
JOB_CONFIG_REQUIRED = ("min_nodes", "max_nodes")


def milli(factor: float) -> int:
    """A factor in thousandths, as the state machine keeps it (8.0 -> 8000)."""
    return round(factor * 1000)


# The workers' own settings. They are not on the wire, but they are defaults users see, so
# they live here too: worker/elastic/config.py (ElasticConfig, the arguments of
# ``elastic_training``) and worker/torchrun.py (``--rdzv-conf``) take every default from this
# module and type none of their own. A JobConfig field the elastic loop sets defaults to
# JOB_CONFIG's, in the loop's units; the torchrun backend's, to TORCHRUN_JOB's.


@dataclass(frozen=True, slots=True)
class ElasticDefaults:
    """``elastic_training``'s settings that are not JobConfig fields (worker/elastic/)."""

    resume: bool = False
    restore: Literal["auto", "checkpoint"] = "auto"
    collective_timeout_s: float = 30.0
    reform_timeout_s: float = 10.0
    rejoin: bool = True
    snapshot_every: int = 0


ELASTIC = ElasticDefaults()


#: The job a torchrun agent (worker/torchrun.py, ``--rdzv-conf``) creates: JOB_CONFIG but where
#: torch's own rendezvous sets the user's expectations. Its timeout (``timeout``) defaults to
#: 900 s; a round with min_nodes present waits a second for more (torch's c10d waits 30 s).
TORCHRUN_JOB = JobConfigDefaults(
    join_timeout_ms=900_000, last_call_ms=1000, acceptable_pause_ms=500
)


@dataclass(frozen=True, slots=True)
class TorchrunAgentDefaults:
    """The torchrun agent's own ``--rdzv-conf`` settings (worker/torchrun.py), in seconds."""

    client_timeout_s: float = 10.0
    store_timeout_s: float = 300.0
    # Where the workers' store listens: each agent serves its own node's workers.
    bridge_host: str = "127.0.0.1"


TORCHRUN_AGENT = TorchrunAgentDefaults()


# Bounds on what one request may ask of a member. A member refuses a request past one with
# INVALID_ARGUMENT naming the bound; the client library checks the same numbers first.

#: The longest lease TTL a grant may ask for (7 days). A lease outlives its holder by its TTL,
#: so a TTL of 2^63-1 ms would keep a lock (and its keys) forever after the holder died.
MAX_LEASE_TTL_MS = 7 * 24 * 3600 * 1000
#: The longest session TTL (7 days): a session's cached answers stay until it expires.
MAX_SESSION_TTL_MS = 7 * 24 * 3600 * 1000
#: The most operations one ``KV/Batch`` or ``RoundStore/Batch`` message may hold. A member
#: serves a message in slices that yield to its event loop, so this bounds memory and the
#: size of the answer, not the loop's stall; the client library sends 512 by default.
MAX_BATCH_OPERATIONS = 10_000
#: The most keys one prefix delete may remove. A member applies a delete in one step of its
#: event loop (the state machine applies entries in log order, the same on every member): 50,000
#: keys take about 0.1 s of CPU there, and on a 3-member cluster sharing 2 loaded cores no
#: member's loop ran more than 0.5 s late; 100,000 made loops 0.6-1.1 s late; 1,000,000 took
#: 2-3 s of CPU, past the election timeout. A larger prefix is refused (INVALID_ARGUMENT naming
#: this bound): delete it by narrower prefixes.
MAX_DELETE_KEYS = 50_000
#: The most keys one lease may hold: its expiry or revoke deletes them all in one step, as a
#: prefix delete does. A put that would attach one more is refused.
MAX_LEASE_KEYS = 50_000
