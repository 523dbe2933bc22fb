"""Canonical msgpack encoding of the state machine's records (commands, results, values).

A record is a frozen dataclass registered here with a small integer tag. It encodes as the
array ``[tag, field_1, field_2, ...]`` in field order; nested records encode the same way,
tuples as arrays, enums as their integer value. Arrays (never maps) make the encoding
canonical: equal values always give equal bytes, whatever the process's hash seed, which is
what lets two replicas compare snapshots byte for byte.

Decoding is driven by the field annotations, so malformed input is rejected with a
:class:`StateCodecError` naming the record and field instead of producing a half-typed value.

Format versions
===============

These bytes outlive the code that wrote them: they sit in WAL entries and snapshots, and in a
rolling upgrade members of two releases replicate the same log. So every record type has a
format version, and the encoding says which one it is by how many fields it carries:

- Version 1 is every field declared without :func:`since` (the record as it stood when
  versions were made explicit). Records written before that may lack trailing fields that have
  defaults; they read with those defaults.
- A later version only appends fields, each declared ``name: T = since(version, default)``,
  and its default must mean "behave as the earlier version did". A default is part of the
  format (older records read as it), so it never changes. Registration checks that versions
  never decrease along the fields and step by one; ``tests/golden/records.json`` pins every
  version's fields and defaults.
- Writing drops trailing fields of version 2 and later that hold their default, so a record
  that uses no newer feature is written in the oldest format that can say it: a member of an
  older release in the same cluster reads it. Version-1 fields are always written, so
  today's bytes never change.
- Reading a record with fewer fields fills the missing ones with their defaults (a newer
  reader meeting an older record). A record with more fields than this build knows was
  written by a newer release using a feature this one lacks: it is refused with one line
  naming the record, its field count and the version this build reads (an older reader
  meeting a newer record must stop, not guess). ``tests/golden`` holds today's bytes, which
  every later version must still read.
"""

from __future__ import annotations

import dataclasses
import enum
import operator
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import msgpack


class StateCodecError(ValueError):
    """Bytes that do not decode to a state-machine record."""


_T = TypeVar("_T")

# Field metadata key: the format version that added the field (absent: version 1).
_SINCE = "rallypoint.codec.since"


def since(version: int, default: _T) -> _T:
    """Declare a record field added in format ``version`` (>= 2), read as ``default`` from
    records written before it. Use as ``name: T = since(2, default)``, after every field of
    earlier versions; ``default`` must be immutable (records are frozen)."""
    if version < 2:
        raise ValueError(f"since({version}): fields of version 1 are declared without since")
    field: Any = dataclasses.field(default=default, metadata={_SINCE: version})
    return typing.cast(_T, field)


@dataclasses.dataclass(frozen=True, slots=True)
class RecordFormat:
    """What this build knows of one record type's encoding."""

    name: str
    tag: int
    # The newest format version: the version of the last field. Invariant: >= 1.
    version: int
    # Every field in encoding order, and the version that added each (non-decreasing, the
    # first 1, each step 0 or 1).
    field_names: tuple[str, ...]
    field_versions: tuple[int, ...]
    # Leading fields without a default: every encoding carries at least these.
    required: int

    def version_of(self, field_count: int) -> int:
        """The format version of an encoding with ``field_count`` fields (that count is
        within ``required..len(field_names)``)."""
        return self.field_versions[field_count - 1] if field_count else 1

    def fields_of(self, version: int) -> tuple[str, ...]:
        """The fields a record of format ``version`` carries."""
        return tuple(
            name
            for name, added in zip(self.field_names, self.field_versions, strict=True)
            if added <= version
        )

    def refusal(self, field_count: int) -> str:
        """The one-line reason a record with more fields than this build knows is refused."""
        return (
            f"{self.name} record (tag {self.tag}) has {field_count} fields: it was written by "
            f"a newer version of rallypoint; this build reads {self.name} up to format version "
            f"{self.version} ({len(self.field_names)} fields); upgrade this member"
        )


def _format_of_class(cls: type[Any], tag: int) -> RecordFormat:
    fields = dataclasses.fields(cls)
    versions = tuple(int(f.metadata.get(_SINCE, 1)) for f in fields)
    previous = 1
    required = 0
    for f, version in zip(fields, versions, strict=True):
        if version not in (previous, previous + 1):
            raise TypeError(
                f"{cls.__name__}.{f.name}: format version {version} follows {previous}; "
                "versions start at 1, never decrease and step by one"
            )
        # dataclass puts every field without a default first; since() always gives one.
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required += 1
        previous = version
    return RecordFormat(
        name=cls.__name__,
        tag=tag,
        version=previous,
        field_names=tuple(f.name for f in fields),
        field_versions=versions,
        required=required,
    )


# Invariant: a bijection between tags and registered record classes; _FORMAT has every class.
_CLASS_BY_TAG: dict[int, type[Any]] = {}
_TAG_BY_CLASS: dict[type[Any], int] = {}
_FORMAT: dict[type[Any], RecordFormat] = {}
# Resolved field annotations per record class, filled lazily (forward references resolve only
# once every module has been imported).
_HINTS: dict[type[Any], list[tuple[str, Any]]] = {}
# _is_record_type's answers; emptied whenever a class is registered. Decoding asks for every
# field of every entry applied, so this is on the apply path.
_IS_RECORD_TYPE: dict[Any, bool] = {}
# _allowed's answers: (record class, allowed record types) -> whether a record of that class
# is one of them (a function of the classes alone, so kept across registrations).
_ALLOWED: dict[tuple[type[Any], tuple[type[Any], ...]], bool] = {}
# Compiled per type, lazily (annotations resolve only once every module is imported), and
# emptied whenever a class is registered: a record class's encoder (value -> list), and a
# decoder per annotation (obj -> value). A snapshot of a job of 100,000 participants holds
# hundreds of thousands of records; walking each one's annotations with typing's
# introspection cost seconds, a compiled step per field costs a fraction of that.
_ENCODERS: dict[type[Any], Callable[[Any], list[Any]]] = {}
_DECODERS: dict[Any, Callable[[Any], Any]] = {}
_RECORD_DECODERS: dict[type[Any], tuple[list[type[Any]], list[Callable[[Any], Any]]]] = {}
# Field types written as they are: msgpack encodes them itself.
_PLAIN = (bool, int, bytes, str)


def record(tag: int) -> typing.Callable[[type[_T]], type[_T]]:
    """Class decorator: register a frozen dataclass under ``tag`` (unique, never reused)."""

    def register(cls: type[_T]) -> type[_T]:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{cls.__name__} is not a dataclass")
        if tag in _CLASS_BY_TAG:
            raise TypeError(f"tag {tag} of {cls.__name__} already names {_CLASS_BY_TAG[tag]}")
        _FORMAT[cls] = _format_of_class(cls, tag)
        _CLASS_BY_TAG[tag] = cls
        _TAG_BY_CLASS[cls] = tag
        _IS_RECORD_TYPE.clear()
        _ENCODERS.clear()
        _DECODERS.clear()
        _RECORD_DECODERS.clear()
        return cls

    return register


def record_formats() -> dict[int, RecordFormat]:
    """Every registered record type's format, by tag."""
    return {tag: _FORMAT[cls] for tag, cls in sorted(_CLASS_BY_TAG.items())}


def record_format(cls: type[Any]) -> RecordFormat:
    """The format of a registered record class (KeyError if it is not one)."""
    return _FORMAT[cls]


def record_class(tag: int) -> type[Any]:
    """The record class registered under ``tag`` (KeyError if none)."""
    return _CLASS_BY_TAG[tag]


def _record_fields(value: Any, fmt: RecordFormat) -> list[Any]:
    """The fields ``value`` is written with: all but trailing ones of version 2 or later that
    hold their default (so an older reader can read a record that uses no newer feature)."""
    fields = [getattr(value, name) for name in fmt.field_names]
    if fmt.version > 1:
        defaults = dataclasses.fields(value)
        count = len(fields)
        while count and fmt.field_versions[count - 1] > 1:
            f = defaults[count - 1]
            default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
            if fields[count - 1] != default:
                break
            count -= 1
        del fields[count:]
    return fields


def _is_plain(hint: Any) -> bool:
    """A field annotation whose values msgpack writes as they are (None included)."""
    if hint in _PLAIN or hint is type(None):
        return True
    supertype = getattr(hint, "__supertype__", None)
    if supertype is not None:
        return _is_plain(supertype)
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return all(_is_plain(member) for member in typing.get_args(hint))
    return False


def _field_encoder(hint: Any) -> Callable[[Any], Any] | None:
    """How a field of type ``hint`` is written: None (as it is), a tuple of plain items as a
    list, anything else through ``to_obj``."""
    if _is_plain(hint):
        return None
    args = typing.get_args(hint)
    plain_items = len(args) == 2 and args[1] is Ellipsis and _is_plain(args[0])
    return list if typing.get_origin(hint) is tuple and plain_items else to_obj


def _compile_encoder(cls: type[Any]) -> Callable[[Any], list[Any]]:
    """``to_obj`` for one record class: plain fields as they are, the others through
    ``to_obj``; trailing default fields dropped as ``_record_fields`` says."""
    fmt = _FORMAT[cls]
    tag = fmt.tag
    if not fmt.field_names:
        return lambda value: [tag]
    convert = [_field_encoder(hint) for _, hint in _hints(cls)]
    if fmt.version > 1:
        return _compile_versioned_encoder(cls, fmt, convert)
    if len(convert) == 1:
        name = fmt.field_names[0]
        one = convert[0] or (lambda field: field)
        return lambda value: [tag, one(getattr(value, name))]
    fields = operator.attrgetter(*fmt.field_names)
    if not any(convert):
        return lambda value: [tag, *fields(value)]
    return lambda value: [
        tag,
        *(f if c is None else c(f) for c, f in zip(convert, fields(value), strict=True)),
    ]


def _compile_versioned_encoder(
    cls: type[Any], fmt: RecordFormat, convert: list[Callable[[Any], Any] | None]
) -> Callable[[Any], list[Any]]:
    """``to_obj`` for a record class with fields of version 2 or later: ``_record_fields``'s
    rule (trailing such fields that hold their default are not written) in one compiled
    step per field. A snapshot holds one Participant (a versioned record) per participant."""
    tag = fmt.tag
    names = fmt.field_names
    first_versioned = fmt.field_versions.index(next(v for v in fmt.field_versions if v > 1))
    defaults = [
        f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(cls)
    ]
    if not any(convert):
        # Every field written as it is (a Participant): one C-speed step for all of them.
        getter = operator.attrgetter(*names) if len(names) > 1 else None
        if getter is not None:

            def encode_plain(value: Any) -> list[Any]:
                fields = getter(value)
                count = len(fields)
                while count > first_versioned and fields[count - 1] == defaults[count - 1]:
                    count -= 1
                return [tag, *fields[:count]]

            return encode_plain
    steps = [c or (lambda field: field) for c in convert]

    def encode(value: Any) -> list[Any]:
        fields = [getattr(value, name) for name in names]
        count = len(fields)
        while count > first_versioned and fields[count - 1] == defaults[count - 1]:
            count -= 1
        return [tag, *(steps[i](fields[i]) for i in range(count))]

    return encode


def to_obj(value: Any) -> Any:
    """The msgpack-ready form of a record, tuple, enum or primitive."""
    cls = type(value)
    encoder = _ENCODERS.get(cls)
    if encoder is not None:
        return encoder(value)
    if cls in _TAG_BY_CLASS:
        encoder = _ENCODERS[cls] = _compile_encoder(cls)
        return encoder(value)
    if isinstance(value, tuple):
        return [to_obj(item) for item in value]
    if isinstance(value, enum.Enum):
        return value.value
    if value is None or isinstance(value, (bool, int, bytes, str)):
        return value
    raise TypeError(f"cannot encode {type(value).__name__} in a state-machine record")


def pack(obj: Any) -> bytes:
    out = msgpack.packb(obj, use_bin_type=True)
    assert isinstance(out, bytes)
    return out


# The most elements of one list that one msgpack call packs in ``pack_sliced``: a call is C
# code that holds the interpreter lock throughout, and a snapshot's lists (every key, every
# history event) run to hundreds of thousands of elements: packed whole on the encoder thread,
# they stopped the member's event loop for tens of milliseconds (40k keys: ~30 ms).
PACK_SLICE = 1024


def pack_sliced(obj: list[Any]) -> bytes:
    """``pack(obj)`` byte for byte, but its long lists (those directly in ``obj``) packed a
    slice of ``PACK_SLICE`` elements at a time: between slices other threads (the event
    loop) get the interpreter lock. A msgpack array is its header and then its elements, so
    a slice packed as an array, minus its own header, is exactly its elements' bytes."""
    packer = msgpack.Packer(use_bin_type=True)
    parts: list[bytes] = [packer.pack_array_header(len(obj))]
    for item in obj:
        if not (isinstance(item, list) and len(item) > PACK_SLICE):
            parts.append(packer.pack(item))
            continue
        parts.append(packer.pack_array_header(len(item)))
        for start in range(0, len(item), PACK_SLICE):
            chunk = item[start : start + PACK_SLICE]
            packed = packer.pack(chunk)
            parts.append(packed[len(packer.pack_array_header(len(chunk))) :])
    return b"".join(parts)


def unpack(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, use_list=True, raw=False, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise StateCodecError(f"not valid msgpack: {exc}") from exc


def encode(value: Any) -> bytes:
    return pack(to_obj(value))


def decode(data: bytes, expected: type[_T]) -> _T:
    value = from_obj(unpack(data), expected)
    assert isinstance(value, expected)
    return value


def _hints(cls: type[Any]) -> list[tuple[str, Any]]:
    hints = _HINTS.get(cls)
    if hints is None:
        resolved = typing.get_type_hints(cls)
        hints = [(f.name, resolved[f.name]) for f in dataclasses.fields(cls)]
        _HINTS[cls] = hints
    return hints


def _record_from_obj(obj: Any, allowed: tuple[type[Any], ...]) -> Any:
    if not isinstance(obj, list) or not obj or type(obj[0]) is not int:
        raise StateCodecError(f"expected a tagged record, got {obj!r}"[:300])
    cls = _CLASS_BY_TAG.get(obj[0])
    if cls is None or not _allowed(cls, allowed):
        names = ", ".join(base.__name__ for base in allowed)
        raise StateCodecError(f"tag {obj[0]} is not a record of type {names}")
    hints = _hints(cls)
    fmt = _FORMAT[cls]
    given = len(obj) - 1
    if given > len(hints):
        raise StateCodecError(fmt.refusal(given))
    if given < fmt.required:
        raise StateCodecError(
            f"{cls.__name__}: expected {len(hints)} fields (at least {fmt.required}), got {given}"
        )
    # Fields added later are trailing and have defaults: older records decode with them.
    plain_types, decoders = _record_decoders(cls)
    try:
        args = [
            field_obj if type(field_obj) is plain else decode(field_obj)
            for plain, decode, field_obj in zip(plain_types, decoders, obj[1:], strict=False)
        ]
    except StateCodecError:
        # Again, field by field, to name the one that failed.
        for (name, hint), field_obj in zip(hints, obj[1:], strict=False):
            try:
                from_obj(field_obj, hint)
            except StateCodecError as exc:
                raise StateCodecError(f"{cls.__name__}.{name}: {exc}") from None
        raise
    return cls(*args)


def _allowed(cls: type[Any], allowed: tuple[type[Any], ...]) -> bool:
    """Whether a record of ``cls`` is one of ``allowed`` (or a subclass of one)."""
    key = (cls, allowed)
    answer = _ALLOWED.get(key)
    if answer is None:
        answer = _ALLOWED[key] = cls in allowed or any(issubclass(cls, b) for b in allowed)
    return answer


class _NotPlain:
    """Never the type of a decoded value: marks a field that needs its decoder."""


def _record_decoders(cls: type[Any]) -> tuple[list[type[Any]], list[Callable[[Any], Any]]]:
    """Per field of ``cls``: the exact type a value taken as it is has (or ``_NotPlain``),
    and the decoder for any other value."""
    compiled = _RECORD_DECODERS.get(cls)
    if compiled is None:
        hints = _hints(cls)
        plain = [hint if hint in _PLAIN else _NotPlain for _, hint in hints]
        decoders = [_compile_decoder(hint) for _, hint in hints]
        compiled = _RECORD_DECODERS[cls] = (plain, decoders)
    return compiled


def _is_record_type(hint: Any) -> bool:
    """A registered record class, or a base class of some (decoded by the tag it carries)."""
    try:
        return _IS_RECORD_TYPE[hint]
    except KeyError:
        pass
    except TypeError:  # an unhashable annotation is never a record class
        return False
    answer = isinstance(hint, type) and any(issubclass(cls, hint) for cls in _TAG_BY_CLASS)
    _IS_RECORD_TYPE[hint] = answer
    return answer


def from_obj(obj: Any, hint: Any) -> Any:
    """Decode ``obj`` (from msgpack) as a value of the annotated type ``hint``."""
    try:
        decoder = _DECODERS[hint]
    except KeyError:
        decoder = _DECODERS[hint] = _compile_decoder(hint)
    except TypeError:  # an unhashable annotation: nothing to cache it under
        return _from_obj(obj, hint)
    return decoder(obj)


def _compile_decoder(hint: Any) -> Callable[[Any], Any]:
    """``from_obj`` for one annotation: the common cases in one step, every other case (and
    every error, so messages stay the same) through ``_from_obj``."""
    if hint in _PLAIN:

        def plain(obj: Any) -> Any:
            return obj if type(obj) is hint else _from_obj(obj, hint)

        return plain
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        members = typing.get_args(hint)
        records = tuple(m for m in members if _is_record_type(m))
        if records:
            # ``Fence | None`` and the like: as ``_from_obj`` decodes them.
            none_allowed = type(None) in members

            def union(obj: Any) -> Any:
                if obj is None and none_allowed:
                    return None
                if type(obj) is list:
                    return _record_from_obj(obj, records)
                return _from_obj(obj, hint)

            return union
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            item_hint = args[0]

            def items(obj: Any) -> Any:
                if type(obj) is not list:
                    return _from_obj(obj, hint)
                return tuple([from_obj(item, item_hint) for item in obj])

            return items
    if _is_record_type(hint):
        # A record class, or a base class of some (``Envelope.command``): as ``_from_obj``
        # decodes it, without its checks for unions, tuples and NewTypes on every value.
        allowed = (hint,)
        return lambda obj: _record_from_obj(obj, allowed)
    return lambda obj: _from_obj(obj, hint)


def _from_obj(obj: Any, hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        members = typing.get_args(hint)
        if obj is None and type(None) in members:
            return None
        records = tuple(m for m in members if _is_record_type(m))
        if records and isinstance(obj, list):
            return _record_from_obj(obj, records)
        for member in members:
            if member is not type(None) and member not in records:
                return from_obj(obj, member)
        raise StateCodecError(f"{obj!r} matches no member of {hint}"[:300])
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(obj, list):
            raise StateCodecError(f"expected an array, got {obj!r}"[:300])
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_obj(item, args[0]) for item in obj)
        # A fixed-length tuple (``tuple[str, int]``): one item per annotation.
        if len(obj) != len(args):
            raise StateCodecError(f"expected {len(args)} items, got {obj!r}"[:300])
        return tuple(from_obj(item, arg) for item, arg in zip(obj, args, strict=True))
    supertype = getattr(hint, "__supertype__", None)
    if supertype is not None:
        return from_obj(obj, supertype)
    if _is_record_type(hint):
        return _record_from_obj(obj, (hint,))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(obj)
        except ValueError as exc:
            raise StateCodecError(str(exc)) from None
    if hint in (bool, int, bytes, str) and type(obj) is hint:
        return obj
    raise StateCodecError(f"expected {getattr(hint, '__name__', hint)}, got {obj!r}"[:300])
