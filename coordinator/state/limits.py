"""The cluster-wide limits every member applies the same way (they decide outcomes)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .jobs import RendezvousLimits


@dataclass(frozen=True, slots=True)
class Limits:
    """Cluster-wide limits. Every member must use the same values: they decide outcomes."""

    max_key_bytes: int = 4 * 1024
    max_value_bytes: int = 1024 * 1024
    max_history_events: int = 10_000
    max_history_bytes: int = 64 * 1024 * 1024
    max_outstanding_answers: int = 1024
    # The most key-values, and bytes of keys and values, in one answer: a Range page (cut
    # short, with `more` set) or one WatchResponse (a larger revision is split into several).
    # These bound what one reply costs a member; they decide no replicated outcome. gRPC
    # clients refuse messages over 4 MiB by default: 3 MiB plus the framing of at most
    # max_answer_keys entries stays below that.
    max_answer_keys: int = 10_000
    max_answer_bytes: int = 3 * 1024 * 1024
    rendezvous: RendezvousLimits = field(default_factory=RendezvousLimits)
