"""The deterministic replicated state machine: sessions, KV, leases, watch history.

``StateMachine.apply(index, data)`` applies a committed entry (an encoded ``Envelope``);
lease deadlines are the leader's soft state (coordinator/leader/lessor.py). See ``machine``
for the rules.
"""

from .commands import Envelope, decode_envelope, encode_envelope
from .limits import Limits
from .machine import StateMachine
from .sessions import SessionInfo

__all__ = [
    "Envelope",
    "Limits",
    "SessionInfo",
    "StateMachine",
    "decode_envelope",
    "encode_envelope",
]
