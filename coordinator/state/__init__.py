"""The deterministic replicated state machine: sessions, KV, leases, watch history.

``StateMachine.apply(index, data)`` applies a committed entry (an encoded ``Envelope``);
``Lessor`` is the leader's soft state for lease deadlines. See ``machine`` for the rules.
"""

from .commands import Envelope, decode_envelope, encode_envelope
from .lessor import Lessor
from .machine import Limits, SessionInfo, StateMachine

__all__ = [
    "Envelope",
    "Lessor",
    "Limits",
    "SessionInfo",
    "StateMachine",
    "decode_envelope",
    "encode_envelope",
]
