"""Fuzzing the stream peer protocol's framing (coordinator/peerwire/frames.py).

What an outsider can send a stream listener before any MAC is checked: a preamble of
another magic, version or kind, or cut short; then frames that are truncated (the
connection ends mid-header or mid-body), that declare a length past the limit (up to
2^32 - 1: refused from the header alone, nothing allocated), of an unknown type, or a
well-formed header followed by garbage (bytes that are not a msgpack record, or a record of
the wrong shape); and *slowloris*: any of these trickled a few bytes at a time with pauses,
to hold the listener's connection open. Each is an :class:`Attack`: its bytes and how they
are sent. The listener must never deliver anything to Raft, must end the connection (an
``ERROR`` frame or a close) within its handshake time whatever the sender does, and must
serve a member's next batch afterwards.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import msgpack
from hypothesis import strategies as st

from rallypoint.coordinator.peerwire import frames

# The first connection kind and frame type not (yet) known: unknown whatever is added.
_NEXT_KIND = max(frames.KINDS) + 1
_NEXT_TYPE = max(frames.FRAME_TYPES) + 1
# Preamble fields worth drawing: the right ones often, the edges of each byte otherwise.
_VERSIONS = st.sampled_from([frames.FRAME_VERSION, frames.FRAME_VERSION, 0, 2, 255])
_KINDS = st.sampled_from([*sorted(frames.KINDS), 0, _NEXT_KIND, 255])
_MAGICS = st.sampled_from([frames.MAGIC, frames.MAGIC, frames.MAGIC, b"RPPX", b"PRI ", b"\0\0\0\0"])
_TYPES = st.sampled_from([*sorted(frames.FRAME_TYPES), 0, _NEXT_TYPE, 255])
# The frame types that carry a request record.
_REQUESTS = [frames.BATCH, frames.CHUNK, frames.HELLO, frames.MEMBERS, frames.LIVENESS]
_LENGTHS = st.one_of(
    st.integers(0, 64),
    st.sampled_from(
        [frames.MAX_FRAME_BYTES, frames.MAX_FRAME_BYTES + 1, 2**31, 2**32 - 1, 1 << 24]
    ),
)


@dataclass(frozen=True, slots=True)
class Attack:
    """Bytes for one connection, sent ``step`` bytes at a time with ``pause_s`` between
    (slowloris when small), or all at once (``step`` 0)."""

    what: str
    data: bytes
    step: int
    pause_s: float


@st.composite
def preambles(draw: st.DrawFn) -> bytes:
    data = struct.pack(">4sBBH", draw(_MAGICS), draw(_VERSIONS), draw(_KINDS), 0)
    if draw(st.integers(0, 9)) == 0:
        data = data[: draw(st.integers(0, len(data) - 1))]  # cut short
    return data


def _garbage_records() -> st.SearchStrategy[bytes]:
    """Bodies that are not what a BATCH/CHUNK/HELLO/MEMBERS/LIVENESS frame carries."""
    return st.one_of(
        st.binary(max_size=64),
        st.builds(
            lambda items: msgpack.packb(items, use_bin_type=True),
            st.lists(
                st.one_of(st.integers(-(2**63), 2**64 - 1), st.binary(max_size=8)), max_size=16
            ),
        ),
        st.just(msgpack.packb({"cluster_id": 1}, use_bin_type=True)),
    )


@st.composite
def frame_bytes(draw: st.DrawFn) -> tuple[str, bytes]:
    kind = draw(st.sampled_from(["truncated", "oversized", "garbage", "unknown type"]))
    frame_type = draw(_TYPES)
    if kind == "oversized":
        length = draw(st.integers(frames.MAX_FRAME_BYTES + 1, 2**32 - 1))
        return kind, struct.pack(">IB", length, frame_type) + draw(st.binary(max_size=32))
    if kind == "unknown type":
        return kind, struct.pack(">IB", 0, draw(st.sampled_from([0, _NEXT_TYPE, 200, 255])))
    body = draw(_garbage_records())
    if kind == "garbage":
        return kind, struct.pack(">IB", len(body), draw(st.sampled_from(_REQUESTS))) + body
    declared = draw(_LENGTHS)
    whole = struct.pack(">IB", declared, frame_type) + body
    return kind, whole[: draw(st.integers(0, max(0, len(whole) - 1)))]


@st.composite
def attacks(draw: st.DrawFn) -> Attack:
    """One connection's worth of bad bytes; see the module docstring."""
    preamble = draw(preambles())
    pieces = [draw(frame_bytes()) for _ in range(draw(st.integers(0, 3)))]
    what = "+".join(["preamble", *(p[0] for p in pieces)])
    data = preamble + b"".join(p[1] for p in pieces)
    if draw(st.integers(0, 3)) == 0:
        return Attack(f"slowloris {what}", data, draw(st.integers(1, 3)), 0.05)
    return Attack(what, data, 0, 0.0)
