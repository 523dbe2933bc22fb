"""torch's TCPStore wire protocol, sans IO: bytes in, requests out; answers in, bytes out.

Theory of operation. The protocol is torch's (torch/csrc/distributed/c10d/TCPStoreBackend.hpp;
checked against the client of the installed torch by tests/worker/test_torchrun.py). A client
sends one request at a time and reads its answer; a request is a one-byte query type, then
its arguments: strings and byte strings are a little-endian u64 length and the bytes, counts
are u64, integers i64. VALIDATE carries a u32 magic number and has no answer; PING echoes its
u32 nonce. SET, APPEND and MULTI_SET have no answer either. WAIT is answered STOP_WAITING
once every key exists; the client sends CANCEL_WAIT when its own timeout passes and expects
WAIT_CANCELED (possibly after a STOP_WAITING that crossed it). GET and MULTI_GET follow a
WAIT on the same keys. The queue and key-listing queries are not served (torch's process
groups do not use them).

This module holds no socket, no event loop and no clock (h11's shape): a
:class:`RequestParser` is fed what the socket delivered and hands out whole requests, each a
frozen dataclass, or None until more bytes come; a request is parsed whole or not at all, so
the code that serves it never waits in the middle of one. The ``encode_*`` functions turn an
answer into the bytes the client expects, and :func:`encode_request` is the client's side
(tests and load generators speak the protocol with it). Bad input is one error,
:class:`ProtocolError`, with a one-line message; after it the parser refuses everything (the
stream has lost its framing), and the server closes the connection.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ..errors import WorkerError

VALIDATION_MAGIC = 0x3C85F7CE

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


class Query(enum.IntEnum):
    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    GETNUMKEYS = 7
    DELETE_KEY = 8
    APPEND = 9
    MULTI_GET = 10
    MULTI_SET = 11
    CANCEL_WAIT = 12
    PING = 13


class CheckResponse(enum.IntEnum):
    READY = 0
    NOT_READY = 1


class WaitResponse(enum.IntEnum):
    STOP_WAITING = 0
    WAIT_CANCELED = 1


class ProtocolError(WorkerError):
    """The peer sent something this bridge does not serve."""


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class Validate:
    """A connection's first request, so that a client that reached some other server
    fails at once: the parser checks its magic number. No answer."""

    query: ClassVar[Query] = Query.VALIDATE
    magic: int


@dataclass(frozen=True, slots=True)
class Ping:
    """Answered with its own nonce (:func:`encode_pong`)."""

    query: ClassVar[Query] = Query.PING
    nonce: int


@dataclass(frozen=True, slots=True)
class Set:
    """No answer: the client goes on once it is sent, and expects a later request of its
    own (or of another client it told) to see the value."""

    query: ClassVar[Query] = Query.SET
    key: bytes
    value: bytes


@dataclass(frozen=True, slots=True)
class CompareSet:
    """Set ``desired`` if the key holds ``expected``, or is absent and ``expected`` is
    empty. Answered with the value the key holds after it (:func:`encode_value`), and for an
    absent key with a non-empty expectation, with the expectation."""

    query: ClassVar[Query] = Query.COMPARE_SET
    key: bytes
    expected: bytes
    desired: bytes


@dataclass(frozen=True, slots=True)
class Get:
    """Answered with the value (:func:`encode_value`); the client sent a WAIT on the key
    first, so it exists."""

    query: ClassVar[Query] = Query.GET
    key: bytes


@dataclass(frozen=True, slots=True)
class Add:
    """Add ``delta`` to the counter at ``key`` (missing: 0); answered with the sum
    (:func:`encode_integer`). ``delta`` 0 reads a counter (a store-based barrier's)."""

    query: ClassVar[Query] = Query.ADD
    key: bytes
    delta: int


@dataclass(frozen=True, slots=True)
class Check:
    """Answered READY if every key exists, else NOT_READY (:func:`encode_check`), at once."""

    query: ClassVar[Query] = Query.CHECK
    keys: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Wait:
    """Answered STOP_WAITING once every key exists (:func:`encode_wait`); meanwhile the
    client may only send CANCEL_WAIT."""

    query: ClassVar[Query] = Query.WAIT
    keys: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class GetNumKeys:
    """Answered with how many keys the store holds (:func:`encode_integer`)."""

    query: ClassVar[Query] = Query.GETNUMKEYS


@dataclass(frozen=True, slots=True)
class DeleteKey:
    """Answered 1 if the key existed, else 0 (:func:`encode_integer`): deleting a missing
    key is no error."""

    query: ClassVar[Query] = Query.DELETE_KEY
    key: bytes


@dataclass(frozen=True, slots=True)
class Append:
    """Append ``value`` to the key's (a missing key counts as empty). No answer, as with
    SET; the store has no append of its own (the bridge calls ``RoundStore.append``)."""

    query: ClassVar[Query] = Query.APPEND
    key: bytes
    value: bytes


@dataclass(frozen=True, slots=True)
class MultiGet:
    """Answered with every key's value in order (:func:`encode_values`), none for no keys;
    the client waited for them first."""

    query: ClassVar[Query] = Query.MULTI_GET
    keys: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class MultiSet:
    """Set every (key, value). No answer, as SET."""

    query: ClassVar[Query] = Query.MULTI_SET
    items: tuple[tuple[bytes, bytes], ...]


@dataclass(frozen=True, slots=True)
class CancelWait:
    """The client's own timeout passed during a WAIT: answered WAIT_CANCELED
    (:func:`encode_wait`), possibly after a STOP_WAITING that crossed it."""

    query: ClassVar[Query] = Query.CANCEL_WAIT


Request = (
    Validate
    | Ping
    | Set
    | CompareSet
    | Get
    | Add
    | Check
    | Wait
    | GetNumKeys
    | DeleteKey
    | Append
    | MultiGet
    | MultiSet
    | CancelWait
)


# --------------------------------------------------------------------------- parsing


class _Short(Exception):
    """The buffer holds only part of a request: read more, then parse it again."""


class _Fields:
    """Reads one request's fields from a buffer, from its start; ``_Short`` past its end."""

    __slots__ = ("at", "buffer")

    def __init__(self, buffer: bytearray) -> None:
        self.buffer = buffer
        self.at = 0

    def value(self, form: struct.Struct) -> int:
        end = self.at + form.size
        if end > len(self.buffer):
            raise _Short
        (value,) = form.unpack_from(self.buffer, self.at)
        self.at = end
        return int(value)

    def data(self) -> bytes:
        length = self.value(_U64)
        end = self.at + length
        if end > len(self.buffer):
            raise _Short
        value = bytes(self.buffer[self.at : end])
        self.at = end
        return value

    def keys(self) -> tuple[bytes, ...]:
        return tuple([self.data() for _ in range(self.value(_U64))])

    def items(self) -> tuple[tuple[bytes, bytes], ...]:
        return tuple([(self.data(), self.data()) for _ in range(self.value(_U64))])


def _parse(fields: _Fields) -> Request:
    code = fields.value(_U8)
    try:
        query = Query(code)
    except ValueError:
        raise ProtocolError(f"query type {code} is not served") from None
    if query is Query.GET:
        return Get(fields.data())
    if query is Query.WAIT:
        return Wait(fields.keys())
    if query is Query.SET:
        return Set(fields.data(), fields.data())
    if query is Query.ADD:
        return Add(fields.data(), fields.value(_I64))
    if query is Query.MULTI_GET:
        return MultiGet(fields.keys())
    if query is Query.CHECK:
        return Check(fields.keys())
    if query is Query.COMPARE_SET:
        return CompareSet(fields.data(), fields.data(), fields.data())
    if query is Query.MULTI_SET:
        return MultiSet(fields.items())
    if query is Query.APPEND:
        return Append(fields.data(), fields.data())
    if query is Query.DELETE_KEY:
        return DeleteKey(fields.data())
    if query is Query.GETNUMKEYS:
        return GetNumKeys()
    if query is Query.CANCEL_WAIT:
        return CancelWait()
    if query is Query.PING:
        return Ping(fields.value(_U32))
    assert query is Query.VALIDATE
    magic = fields.value(_U32)
    if magic != VALIDATION_MAGIC:
        raise ProtocolError(f"bad validation number {magic:#x}")
    return Validate(magic)


class RequestParser:
    """The requests in the bytes one connection delivers, in order.

    Invariant: ``_buffer`` starts at a request's first byte (or is empty); once a
    ProtocolError was raised, ``_error`` is it and every later call raises it again."""

    __slots__ = ("_buffer", "_error")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._error: ProtocolError | None = None

    def receive_data(self, data: bytes) -> None:
        """Take the next bytes the connection delivered (any split of the stream)."""
        self._buffer += data

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and not yet handed out as a request (a request's part, or more)."""
        return len(self._buffer)

    def next_request(self) -> Request | None:
        """The next whole request, taken from what was received, or None until more bytes
        come; ProtocolError if the bytes are no request this bridge serves."""
        if self._error is not None:
            raise self._error
        fields = _Fields(self._buffer)
        try:
            request = _parse(fields)
        except _Short:
            return None
        except ProtocolError as error:
            self._error = error
            raise
        del self._buffer[: fields.at]
        return request


# --------------------------------------------------------------------------- answers


def encode_value(value: bytes) -> bytes:
    """A GET's answer (and one value of a MULTI_GET's or a COMPARE_SET's)."""
    return _U64.pack(len(value)) + value


def encode_values(values: Sequence[bytes]) -> bytes:
    """A MULTI_GET's answer: the values in the order of its keys."""
    return b"".join([_U64.pack(len(value)) + value for value in values])


def encode_integer(value: int) -> bytes:
    """An ADD's, DELETE_KEY's (1 or 0) or GETNUMKEYS's answer."""
    return _I64.pack(value)


def encode_check(ready: bool) -> bytes:
    return _U8.pack(CheckResponse.READY if ready else CheckResponse.NOT_READY)


def encode_wait(response: WaitResponse) -> bytes:
    return _U8.pack(response)


def encode_pong(nonce: int) -> bytes:
    return _U32.pack(nonce)


# --------------------------------------------------------------------------- the client's side


def encode_request(request: Request) -> bytes:
    """The bytes torch's client sends for ``request``."""
    if isinstance(request, Validate | Ping):
        fields = _U32.pack(request.magic if isinstance(request, Validate) else request.nonce)
    elif isinstance(request, Set | Append):
        fields = encode_values((request.key, request.value))
    elif isinstance(request, CompareSet):
        fields = encode_values((request.key, request.expected, request.desired))
    elif isinstance(request, Get | DeleteKey):
        fields = encode_value(request.key)
    elif isinstance(request, Add):
        fields = encode_value(request.key) + _I64.pack(request.delta)
    elif isinstance(request, Check | Wait | MultiGet):
        fields = _U64.pack(len(request.keys)) + encode_values(request.keys)
    elif isinstance(request, MultiSet):
        flat = [part for item in request.items for part in item]
        fields = _U64.pack(len(request.items)) + encode_values(flat)
    else:
        fields = b""  # GETNUMKEYS, CANCEL_WAIT
    return _U8.pack(request.query) + fields
