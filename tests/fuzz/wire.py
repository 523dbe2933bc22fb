"""Protobuf requests built field by field from their descriptors, and mutations of bytes.

Theory of operation. A request is generated at the wire level, not through the generated
classes, so it can hold what those classes refuse to build: a string that is not UTF-8, an
int32 field carrying a 64-bit value, a bool of 7, an enum value no .proto names, a scalar
field sent twice, a known field number with the wrong wire type, unknown fields. Each field
is drawn by a hypothesis strategy chosen from its descriptor's type, with the edge values
of that type drawn often (0, 1, the maximum and one less, the minimum, values past the
type's width, negative values for signed types); strings and bytes are empty, short, long
(past the cluster's limits) or from a dictionary of meaningful words; repeated fields hold
several values, packed or not; nested messages recurse to a bounded depth; a oneof may get
none, one or several of its members. Values a live cluster handed out (session, lease and
participant ids, revisions, job names, keys) are kept in a :class:`Pool` and drawn too, so
requests get past "not found" into the code behind it. Besides these *wild* requests, half
are *plausible*: what a client could mean (fields present, values from the pool under the
field's own name, dictionary words, small numbers, a live session's next sequence), so that
they get past validation into the state machine.

:func:`mutated` damages a generated request's bytes: bit flips, truncation, a slice
duplicated or deleted, random bytes inserted. Everything is a strategy: one seed gives one
sequence of requests (the pool's values aside, which come from the cluster).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

T = TypeVar("T")

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
U64_MASK = 2**64 - 1
# How deep nested messages go (a request's header, its fence, a job config: 2 is enough).
MAX_DEPTH = 3

FD = FieldDescriptor
_SIGNED_64 = (FD.TYPE_INT64, FD.TYPE_SINT64, FD.TYPE_SFIXED64)
_SIGNED_32 = (FD.TYPE_INT32, FD.TYPE_SINT32, FD.TYPE_SFIXED32)
_UNSIGNED_64 = (FD.TYPE_UINT64, FD.TYPE_FIXED64)
_UNSIGNED_32 = (FD.TYPE_UINT32, FD.TYPE_FIXED32)

# Edge values per kind. The last values of the 32-bit lists are wider than the field: the
# parser truncates them, as it must for any varint on the wire.
EDGES_U64: tuple[int, ...] = (
    0,
    1,
    2,
    3,
    2**31 - 1,
    2**32,
    2**53,
    2**62 - 1,
    2**62,
    2**63 - 1,
    2**63,
    2**64 - 2,
    2**64 - 1,
)
EDGES_I64: tuple[int, ...] = (
    0,
    1,
    -1,
    2,
    1000,
    2**31 - 1,
    -(2**31),
    2**32,
    10**12,
    -(10**12),
    2**62,
    2**63 - 2,
    2**63 - 1,
    -(2**63),
    -(2**63) + 1,
)
EDGES_I32: tuple[int, ...] = (
    0,
    1,
    -1,
    2,
    3,
    128,
    2**31 - 2,
    2**31 - 1,
    -(2**31),
    -(2**31) + 1,
    2**40,
    -(2**40),
)
EDGES_U32: tuple[int, ...] = (0, 1, 2, 2**32 - 2, 2**32 - 1, 2**40)
EDGES_ENUM: tuple[int, ...] = (-1, 5, 99, 2**31 - 1, -(2**31))  # values no enum here names
EDGES_DOUBLE: tuple[float, ...] = (
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.001,
    0.0009,
    1e-308,
    1e308,
    4.5e15,
    2.0**62,
    float("inf"),
    float("-inf"),
    float("nan"),
)

WORDS = (
    "",
    "a",
    "job-a",
    "job-b",
    "job.b_1",
    "fuzz",
    "J" * 128,
    "J" * 129,
    "has space",
    "slash/inside",
    "127.0.0.1:1",
    "127.0.0.1:65535",
    "127.0.0.1:0",
    "127.0.0.1:70000",
    "[::1]:2",
    "[::1:2",
    "host:",
    ":80",
    "x:y",
    "é",
    "\u0000",
    "\U0001f600",
    "..",
    "-",
    "file:///tmp/ckpt",
    "s3://bucket/step-1",
)
KEYS = (
    b"",
    b"fuzz/a",
    b"fuzz/b",
    b"fuzz/",
    b"f",
    b"\x00",
    b"\xff\xff",
    b"key with space",
    b"fuzz/check",
)
# Strings whose bytes are not UTF-8: a proto3 string field must refuse them when parsed.
NOT_UTF8 = (b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"job\xfe", b"\x80")
LONG_SIZES = (256, 4095, 4096, 4097, 65_536, 1_048_577)


def varint(value: int) -> bytes:
    """The base-128 varint of ``value`` as a 64-bit two's-complement number."""
    value &= U64_MASK
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def zigzag(value: int) -> int:
    return ((value << 1) ^ (value >> 63)) & U64_MASK


def tag(number: int, wire_type: int) -> bytes:
    return varint((number << 3) | wire_type)


def length_delimited(number: int, payload: bytes) -> bytes:
    return tag(number, LENGTH) + varint(len(payload)) + payload


class Pool:
    """Values the cluster handed out, kept so that later requests can name them: all of
    them, and each under the name of the field it came in (a ``session_id`` goes back into
    ``session_id`` fields more often than into others). A field named ``sequence`` draws
    from a counter too, as a session's requests must.

    Invariant: each list holds at most ``limit`` distinct values, the newest last.
    """

    def __init__(self, limit: int = 256) -> None:
        self.limit = limit
        # Message strategies built for this pool, by (message name, depth, plausible).
        self.strategies: dict[tuple[str, int, bool], st.SearchStrategy[bytes]] = {}
        self.ints: list[int] = []
        self.texts: list[str] = []
        self.blobs: list[bytes] = []
        self.named: dict[str, list[Any]] = {}
        self._sequence = 0
        # A session kept open by the runner (0: none): plausible headers name it most.
        self.live_session = 0

    def _keep(self, values: list[Any], value: Any) -> None:
        if value in values:
            return
        values.append(value)
        if len(values) > self.limit:
            del values[0]

    def harvest(self, message: Message) -> None:
        """Keep every non-zero integer, short string and short bytes value in ``message``."""
        for field, value in message.ListFields():
            values = value if field.is_repeated else [value]
            for item in values:
                if field.type == FD.TYPE_MESSAGE:
                    self.harvest(item)
                    continue
                if field.type == FD.TYPE_STRING:
                    if not 0 < len(item) <= 128:
                        continue
                    self._keep(self.texts, item)
                elif field.type == FD.TYPE_BYTES:
                    if not 0 < len(item) <= 256:
                        continue
                    self._keep(self.blobs, item)
                elif field.type in (FD.TYPE_BOOL, FD.TYPE_DOUBLE, FD.TYPE_FLOAT) or not item:
                    continue
                else:
                    item = int(item)
                    self._keep(self.ints, item)
                self._keep(self.named.setdefault(field.name, []), item)

    def next_sequence(self) -> int:
        self._sequence += 1
        return self._sequence

    def int_at(self, index: int, fallback: int) -> int:
        return self.ints[index % len(self.ints)] if self.ints else fallback

    def text_at(self, index: int, fallback: str) -> str:
        return self.texts[index % len(self.texts)] if self.texts else fallback

    def blob_at(self, index: int, fallback: bytes) -> bytes:
        return self.blobs[index % len(self.blobs)] if self.blobs else fallback

    def named_at(self, name: str, index: int, fallback: T) -> T:
        """A value that came in a field called ``name`` (of the fallback's type)."""
        values = [v for v in self.named.get(name, ()) if isinstance(v, type(fallback))]
        return values[index % len(values)] if values else fallback


def weighted(options: Sequence[tuple[int, st.SearchStrategy[T]]]) -> st.SearchStrategy[T]:
    """One of ``options``, each chosen in proportion to its weight."""
    choices = [strategy for weight, strategy in options for _ in range(weight)]
    return st.sampled_from(choices).flatmap(lambda strategy: strategy)


def _pooled(pick: Callable[[int], T]) -> st.SearchStrategy[T]:
    # The index is drawn whatever the pool holds, so a seed draws the same choices.
    return st.integers(0, 2**16).map(pick)


def _small_int(pool: Pool) -> st.SearchStrategy[int]:
    return weighted(
        [
            (3, st.integers(0, 8)),
            (2, _pooled(lambda i: pool.int_at(i, 1))),
            (1, _pooled(lambda i: pool.int_at(i, 1) + 1)),
        ]
    )


def integer_values(field_type: int, pool: Pool, name: str = "") -> st.SearchStrategy[int]:
    """Values for an integer field: edges of its type, any value in range, pool values
    (those that came in a field of the same name most)."""
    if field_type in _SIGNED_64:
        edges, any_value = EDGES_I64, st.integers(-(2**63), 2**63 - 1)
    elif field_type in _SIGNED_32:
        edges, any_value = EDGES_I32, st.integers(-(2**31), 2**31 - 1)
    elif field_type in _UNSIGNED_64:
        edges, any_value = EDGES_U64, st.integers(0, 2**64 - 1)
    else:
        edges, any_value = EDGES_U32, st.integers(0, 2**32 - 1)
    options = [
        (3, st.sampled_from(edges)),
        (2, any_value),
        (3, _small_int(pool)),
        (1, _pooled(lambda i: -pool.int_at(i, 1))),
        (4, _pooled(lambda i: pool.named_at(name, i, 1))),
    ]
    if name == "sequence":
        options.append((6, st.just(0).map(lambda _: pool.next_sequence())))
    return weighted(options)


def _long(unit: st.SearchStrategy[T], join: Callable[[T, int], T]) -> st.SearchStrategy[T]:
    return st.tuples(unit, st.sampled_from(LONG_SIZES)).map(lambda pair: join(*pair))


def text_values(pool: Pool, name: str = "") -> st.SearchStrategy[bytes]:
    """A string field's bytes: UTF-8 text, dictionary words, pool values, long strings, and
    sometimes bytes that are not UTF-8 at all."""
    return weighted(
        [
            (3, _pooled(lambda i: pool.named_at(name, i, "job-a").encode())),
            (3, st.text(max_size=24).map(str.encode)),
            (3, st.sampled_from(WORDS).map(str.encode)),
            (3, _pooled(lambda i: pool.text_at(i, "job-a").encode())),
            (1, _long(st.sampled_from(("a", "é", "/")), lambda c, n: c * n).map(str.encode)),
            (1, st.sampled_from(NOT_UTF8)),
        ]
    )


def bytes_values(pool: Pool, name: str = "") -> st.SearchStrategy[bytes]:
    return weighted(
        [
            (2, _pooled(lambda i: pool.named_at(name, i, b"fuzz/a"))),
            (3, st.binary(max_size=24)),
            (3, st.sampled_from(KEYS)),
            (2, _pooled(lambda i: pool.blob_at(i, b"fuzz/a"))),
            (1, _long(st.binary(min_size=1, max_size=1), lambda b, n: b * n)),
        ]
    )


def _scalar(field: FieldDescriptor, pool: Pool) -> st.SearchStrategy[tuple[int, bytes]]:
    """(wire type, encoded value) for one value of a non-message field."""
    kind = field.type
    if kind == FD.TYPE_BOOL:
        return st.sampled_from((0, 1, 1, 0, 2, 255, 2**64 - 1)).map(lambda v: (VARINT, varint(v)))
    if kind == FD.TYPE_ENUM:
        assert field.enum_type is not None
        known = [value.number for value in field.enum_type.values]
        return weighted([(3, st.sampled_from(known)), (1, st.sampled_from(EDGES_ENUM))]).map(
            lambda v: (VARINT, varint(v))
        )
    if kind == FD.TYPE_DOUBLE:
        doubles = weighted([(2, st.sampled_from(EDGES_DOUBLE)), (1, st.floats())])
        return doubles.map(lambda v: (FIXED64, struct.pack("<d", v)))
    if kind == FD.TYPE_FLOAT:
        return st.floats(width=32).map(lambda v: (FIXED32, struct.pack("<f", v)))
    if kind == FD.TYPE_STRING:
        return text_values(pool, field.name).map(lambda b: (LENGTH, varint(len(b)) + b))
    if kind == FD.TYPE_BYTES:
        return bytes_values(pool, field.name).map(lambda b: (LENGTH, varint(len(b)) + b))
    values = integer_values(kind, pool, field.name)
    if kind in (FD.TYPE_SINT32, FD.TYPE_SINT64):
        return values.map(lambda v: (VARINT, varint(zigzag(v))))
    if kind in (FD.TYPE_FIXED64, FD.TYPE_SFIXED64):
        return values.map(lambda v: (FIXED64, struct.pack("<Q", v & U64_MASK)))
    if kind in (FD.TYPE_FIXED32, FD.TYPE_SFIXED32):
        return values.map(lambda v: (FIXED32, struct.pack("<I", v & 0xFFFF_FFFF)))
    return values.map(lambda v: (VARINT, varint(v)))


def _wrong_wire_type(number: int, expected: int) -> st.SearchStrategy[bytes]:
    """A value under ``number`` with a wire type the field does not have."""
    if expected == LENGTH:
        return st.integers(0, 2**64 - 1).map(lambda v: tag(number, VARINT) + varint(v))
    return st.binary(max_size=8).map(lambda b: length_delimited(number, b))


def _plausible(field: FieldDescriptor, pool: Pool) -> st.SearchStrategy[tuple[int, bytes]]:
    """(wire type, encoded value) for a value a client could mean: pool values of the same
    name, dictionary words, small numbers."""
    kind, name = field.type, field.name
    if kind in (FD.TYPE_STRING, FD.TYPE_BYTES):
        words = (
            st.sampled_from(WORDS).map(str.encode)
            if kind == FD.TYPE_STRING
            else (st.sampled_from(KEYS))
        )
        fallback: Any = "job-a" if kind == FD.TYPE_STRING else b"fuzz/a"
        values = weighted(
            [(4, _pooled(lambda i: pool.named_at(name, i, fallback))), (2, words)]
        ).map(lambda v: v.encode() if isinstance(v, str) else v)
        return values.map(lambda b: (LENGTH, varint(len(b)) + b))
    if kind == FD.TYPE_BOOL:
        return st.sampled_from((0, 1)).map(lambda v: (VARINT, varint(v)))
    if kind == FD.TYPE_ENUM:
        assert field.enum_type is not None
        known = [value.number for value in field.enum_type.values]
        return st.sampled_from(known).map(lambda v: (VARINT, varint(v)))
    if kind in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        doubles = st.sampled_from((0.5, 1.0, 3.0, 8.0, 16.0))
        packing = "<d" if kind == FD.TYPE_DOUBLE else "<f"
        wire_type = FIXED64 if kind == FD.TYPE_DOUBLE else FIXED32
        return doubles.map(lambda v: (wire_type, struct.pack(packing, v)))
    options = [
        (4, _pooled(lambda i: pool.named_at(name, i, 1))),
        (2, st.just(0)),  # "none", for an optional reference such as a lease id
        (3, st.integers(1, 8)),
        (1, st.integers(0, 100_000)),
    ]
    if name == "sequence":
        options.append((8, st.just(0).map(lambda _: pool.next_sequence())))
    if name == "first_unacked":
        options.append((8, st.just(0)))
    return weighted(options).map(lambda v: (VARINT, varint(v)))


def field_values(
    field: FieldDescriptor, pool: Pool, depth: int, plausible: bool = False
) -> st.SearchStrategy[bytes]:
    """Every occurrence of ``field`` in a message, encoded with tags (empty when absent).
    ``plausible``: a value a client could mean (see :func:`message_bytes`)."""
    number = field.number
    if field.type == FD.TYPE_MESSAGE:
        if depth >= MAX_DEPTH:
            return st.just(b"")
        nested_type = field.message_type
        assert nested_type is not None
        nested = st.deferred(lambda: message_bytes(nested_type, pool, depth + 1, plausible))
        one = nested.map(lambda payload: length_delimited(number, payload))
        expected = LENGTH
    else:
        scalar = _plausible(field, pool) if plausible else _scalar(field, pool)
        one = scalar.map(lambda value: tag(number, value[0]) + value[1])
        expected = VARINT if field.type not in (FD.TYPE_STRING, FD.TYPE_BYTES) else LENGTH
    if plausible:
        if field.is_repeated:
            return st.lists(one, max_size=3).map(b"".join)
        if field.containing_oneof is not None:
            return weighted([(2, st.just(b"")), (1, one)])
        if field.type == FD.TYPE_MESSAGE and field.name != "header":
            # Optional parts (a fence, a config) are often left out; a mutating request's
            # header is required, and a client sends it.
            return weighted([(1, st.just(b"")), (2, one)])
        return weighted([(1, st.just(b"")), (9, one)])
    if field.is_repeated:
        options: list[tuple[int, st.SearchStrategy[bytes]]] = [
            (3, st.lists(one, max_size=4).map(b"".join))
        ]
        if field.type not in (FD.TYPE_MESSAGE, FD.TYPE_STRING, FD.TYPE_BYTES):
            packed = st.lists(_scalar(field, pool), max_size=6).map(
                lambda values: length_delimited(number, b"".join(v for _, v in values))
            )
            options.append((1, packed))
        return weighted(options)
    return weighted(
        [
            (4, st.just(b"")),
            (6, one),
            (1, st.tuples(one, one).map(b"".join)),  # sent twice: the last one wins
            (1, _wrong_wire_type(number, expected)),
        ]
    )


def _unknown_field() -> st.SearchStrategy[bytes]:
    return st.tuples(st.integers(50, 2**29 - 1), st.binary(max_size=8)).map(
        lambda pair: length_delimited(pair[0], pair[1])
    )


def message_bytes(
    descriptor: Descriptor, pool: Pool, depth: int = 0, plausible: bool = False
) -> st.SearchStrategy[bytes]:
    """A serialized ``descriptor`` message, drawn field by field (see the module docstring).
    Fields go in order, or in reverse order (parsers must accept any). A *plausible*
    message is what a client could mean: most fields present, values from the pool (under
    the field's name), dictionary words and small numbers, a session's next sequence: such
    requests get past validation into the state machine."""
    key = (descriptor.full_name, depth, plausible)
    if key not in pool.strategies:
        parts = [field_values(field, pool, depth, plausible) for field in descriptor.fields]
        unknown = weighted([(6, st.just(b"")), (1, _unknown_field())])
        strategy = (
            st.tuples(st.tuples(*parts), st.booleans(), unknown).map(
                lambda drawn: b"".join(drawn[0][::-1] if drawn[1] else drawn[0]) + drawn[2]
            )
            if parts
            else unknown
        )
        if plausible and descriptor.full_name == SESSION_HEADER:
            strategy = weighted([(1, strategy), (4, _session_header(descriptor, pool))])
        pool.strategies[key] = strategy
    return pool.strategies[key]


# A message whose validity spans its fields: a live session and its next sequence.
SESSION_HEADER = "rallypoint.v1.RequestHeader"


def _session_header(descriptor: Descriptor, pool: Pool) -> st.SearchStrategy[bytes]:
    """A header a client of a live session would send: the session's id and the next
    sequence (a counter shared by every session, so it increases in each)."""
    fields = descriptor.fields_by_name

    def build(index: int) -> bytes:
        # Mostly the session the runner keeps alive; the fuzz closes and expires others.
        if pool.live_session and index % 4:
            session = pool.live_session
        else:
            session = pool.named_at("session_id", index, 1)
        return (
            tag(fields["session_id"].number, VARINT)
            + varint(session)
            + tag(fields["sequence"].number, VARINT)
            + varint(pool.next_sequence())
        )

    return _pooled(build)


# -- mutations ----------------------------------------------------------------------------

FLIP, TRUNCATE, DUPLICATE, DELETE, INSERT, CONTINUE = range(6)


def mutate(data: bytes, operations: Sequence[tuple[int, int, int, bytes]]) -> bytes:
    """Apply each (kind, position, length, bytes) in turn; positions wrap around the data."""
    out = bytearray(data)
    for kind, position, length, extra in operations:
        size = len(out)
        at = position % (size + 1)
        end = min(size, at + length)
        if kind == FLIP and size:
            bit = position % (size * 8)
            out[bit // 8] ^= 1 << (bit % 8)
        elif kind == TRUNCATE:
            del out[at:]
        elif kind == DUPLICATE:
            out[end:end] = out[at:end]
        elif kind == DELETE:
            del out[at:end]
        elif kind == INSERT:
            out[at:at] = extra
        elif kind == CONTINUE and size:
            # A varint that never ends, or a length that points past the end.
            out[at % size] |= 0x80
    return bytes(out)


def mutations() -> st.SearchStrategy[list[tuple[int, int, int, bytes]]]:
    operation = st.tuples(
        st.integers(FLIP, CONTINUE),
        st.integers(0, 2**20),
        st.integers(1, 16),
        st.binary(min_size=1, max_size=8),
    )
    return st.lists(operation, min_size=1, max_size=3)


def mutated(requests: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return st.tuples(requests, mutations()).map(lambda pair: mutate(*pair))


def request_bytes(descriptor: Descriptor, pool: Pool) -> st.SearchStrategy[bytes]:
    """Generated requests, wild and plausible ones, some of them mutated."""
    wild = message_bytes(descriptor, pool)
    plausible = message_bytes(descriptor, pool, plausible=True)
    return weighted([(2, wild), (4, plausible), (1, mutated(wild)), (1, mutated(plausible))])
