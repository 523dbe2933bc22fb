"""An elastic run's settings (:class:`ElasticConfig`) and its event handler's check.

The settings travel as one frozen object, as torch elastic's ``RendezvousSettings`` do: the
arguments of ``elastic_training`` (``ElasticRun``) but ``state`` and ``on_event``, which are
what the run trains and whom it tells, not settings. Every default comes from
``rallypoint.proto.v1.defaults`` and is typed nowhere else: a JobConfig field from
``JOB_CONFIG`` in this module's units (seconds where the name ends in ``_s``), the loop's own
from ``ELASTIC``. ``None`` means "derived" (say so on the field) or "none".
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, Literal

from rallypoint.client import JobConfig
from rallypoint.proto.v1.defaults import ELASTIC, JOB_CONFIG

RestoreMode = Literal["auto", "checkpoint"]
EventHandler = Callable[[str, Mapping[str, Any]], object]


@dataclass(frozen=True, slots=True)
class ElasticConfig:
    """The settings of an elastic run: the arguments of ``elastic_training`` but ``state``
    and ``on_event``, with their meaning in ``ElasticRun``'s docstring (docs/api.md). A bad
    value is refused here, in one line naming it."""

    endpoints: str | Sequence[str]
    _: KW_ONLY
    job: str
    name: str
    checkpoint_dir: str | Path
    min_nodes: int
    max_nodes: int
    max_steps: int | None = None
    resume: bool = ELASTIC.resume
    keep_checkpoints: int = JOB_CONFIG.keep_checkpoints
    restore: RestoreMode = ELASTIC.restore
    # None: nccl with CUDA, else gloo.
    backend: str | None = None
    collective_timeout_s: float = ELASTIC.collective_timeout_s
    reform_timeout_s: float = ELASTIC.reform_timeout_s
    join_timeout_s: float = JOB_CONFIG.join_timeout_ms / 1000
    # None: join_timeout_s (see connect_s).
    connect_timeout_s: float | None = None
    heartbeat_interval_ms: int = JOB_CONFIG.heartbeat_interval_ms
    phi_threshold: float = JOB_CONFIG.phi_threshold
    acceptable_pause_ms: int = JOB_CONFIG.acceptable_pause_ms
    last_call_s: float = JOB_CONFIG.last_call_ms / 1000
    rejoin: bool = ELASTIC.rejoin
    # None: the one in client_options, else $RALLYPOINT_TOKEN. Kept out of the repr.
    token: str | None = field(default=None, repr=False)
    client_options: Mapping[str, Any] | None = None
    hang_factor: float = JOB_CONFIG.hang_factor
    hang_floor_s: float = JOB_CONFIG.hang_floor_ms / 1000
    startup_timeout_s: float = JOB_CONFIG.startup_timeout_ms / 1000
    straggler_factor: float = JOB_CONFIG.straggler_factor
    straggler_windows: int = JOB_CONFIG.straggler_windows
    straggler_window_s: float = JOB_CONFIG.straggler_window_ms / 1000
    straggler_hold_windows: int = JOB_CONFIG.straggler_hold_windows
    snapshot_every: int = ELASTIC.snapshot_every
    # None: the snapshots' own default (worker/snapshots/).
    snapshot_copies: int | None = None
    snapshot_erasure: tuple[int, int] | None = None
    # None: the machine's host name. Also the participant's failure domain.
    host: str | None = None
    unit_size: int = JOB_CONFIG.unit_size
    domain_size: int = JOB_CONFIG.domain_size
    units_within_domains: bool = JOB_CONFIG.units_within_domains
    # None: the address the host name resolves to.
    snapshot_address: str | None = None
    # None: snapshots are kept in the worker's own memory (worker/snapshots/hostfiles.py).
    snapshot_dir: str | Path | None = None
    # Called on every rank of a forming round before the restore: why this rank's domain
    # should be drained, or None (health.py; HealthCheck, typed loosely here because the
    # check takes the round, whose module imports this one).
    health_check: Callable[[Any], str | None] | None = None

    def __post_init__(self) -> None:
        for setting, seconds in (
            ("join_timeout_s", self.join_timeout_s),
            ("connect_timeout_s", self.connect_s),
        ):
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError(f"elastic_training({setting}={seconds!r}): must be more than 0")
        if self.snapshot_every < 0:
            raise ValueError(
                f"elastic_training(snapshot_every={self.snapshot_every!r}): must be >= 0"
            )
        if self.health_check is not None and not callable(self.health_check):
            raise TypeError(
                "elastic_training(health_check=...): must be a callable "
                f"check(round) -> str | None, got {type(self.health_check).__name__}"
            )
        if self.unit_size < 1:
            raise ValueError(f"elastic_training(unit_size={self.unit_size!r}): must be >= 1")
        if self.domain_size < 0:
            raise ValueError(f"elastic_training(domain_size={self.domain_size!r}): must be >= 0")
        if self.snapshot_copies is not None and self.snapshot_erasure is not None:
            raise ValueError("elastic_training: give snapshot_copies or snapshot_erasure, not both")

    @property
    def connect_s(self) -> float:
        """How long joining waits while no coordinator member can serve it (patience.py):
        ``connect_timeout_s``, else ``join_timeout_s``."""
        return self.join_timeout_s if self.connect_timeout_s is None else self.connect_timeout_s

    def job_config(self) -> JobConfig:
        """The job's configuration, as the worker's join creates the job with it: every
        JobConfig field this config has a setting for (``x_ms`` from ``x_s``, in whole
        milliseconds), the others JobConfig's defaults. Jobs of the elastic loop scale up: a
        waiting worker ends a round smaller than max_nodes."""
        values: dict[str, Any] = {"scale_up": True}
        for job_field in dataclasses.fields(JobConfig):
            name = job_field.name
            seconds = f"{name.removesuffix('_ms')}_s"
            if name in _SETTINGS:
                values[name] = getattr(self, name)
            elif name.endswith("_ms") and seconds in _SETTINGS:
                values[name] = int(getattr(self, seconds) * 1000)
        return JobConfig(**values)


_SETTINGS = frozenset(f.name for f in dataclasses.fields(ElasticConfig))


def event_handler(on_event: EventHandler | None) -> EventHandler | None:
    """``on_event`` if it can be called as ``on_event(kind, fields)``. A callable that takes
    one argument (``def cb(event)``) would raise at the first event, inside the run, and
    kill the worker at its join: it is refused here, saying how it is called."""
    if on_event is None:
        return None
    if not callable(on_event):
        raise TypeError(f"on_event must be a callable, got {type(on_event).__name__}")
    try:
        inspect.signature(on_event).bind("joined", {})
    except TypeError:
        shown = getattr(on_event, "__qualname__", repr(on_event))
        raise TypeError(
            f"on_event is called as on_event(kind, fields): kind is the event's name (e.g. "
            f"'round_formed'), fields a dict of its values; {shown} cannot take those two "
            "arguments (see docs/api.md, 'Events')"
        ) from None
    except ValueError:  # no signature to read (some builtins): trust it
        pass
    return on_event
