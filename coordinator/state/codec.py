"""Canonical msgpack encoding of the state machine's records (commands, results, values).

A record is a frozen dataclass registered here with a small integer tag. It encodes as the
array ``[tag, field_1, field_2, ...]`` in field order; nested records encode the same way,
tuples as arrays, enums as their integer value. Arrays (never maps) make the encoding
canonical: equal values always give equal bytes, whatever the process's hash seed, which is
what lets two replicas compare snapshots byte for byte.

Decoding is driven by the field annotations, so malformed input is rejected with a
:class:`StateCodecError` naming the record and field instead of producing a half-typed value.

Evolving a record: a field is only ever added at the end, with a default. A record written
before the field existed (fewer fields) decodes with the default; a record with more fields
than this version knows was written by a newer version and is refused, saying so.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any, TypeVar

import msgpack


class StateCodecError(ValueError):
    """Bytes that do not decode to a state-machine record."""


_T = TypeVar("_T")

# Invariant: a bijection between tags and registered record classes.
_CLASS_BY_TAG: dict[int, type[Any]] = {}
_TAG_BY_CLASS: dict[type[Any], int] = {}
# Resolved field annotations per record class, filled lazily (forward references resolve only
# once every module has been imported).
_HINTS: dict[type[Any], list[tuple[str, Any]]] = {}
# _is_record_type's answers; emptied whenever a class is registered. Decoding asks for every
# field of every entry applied, so this is on the apply path.
_IS_RECORD_TYPE: dict[Any, bool] = {}


def record(tag: int) -> typing.Callable[[type[_T]], type[_T]]:
    """Class decorator: register a frozen dataclass under ``tag`` (unique, never reused)."""

    def register(cls: type[_T]) -> type[_T]:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{cls.__name__} is not a dataclass")
        if tag in _CLASS_BY_TAG:
            raise TypeError(f"tag {tag} of {cls.__name__} already names {_CLASS_BY_TAG[tag]}")
        _CLASS_BY_TAG[tag] = cls
        _TAG_BY_CLASS[cls] = tag
        _IS_RECORD_TYPE.clear()
        return cls

    return register


def to_obj(value: Any) -> Any:
    """The msgpack-ready form of a record, tuple, enum or primitive."""
    tag = _TAG_BY_CLASS.get(type(value))
    if tag is not None:
        return [tag, *(to_obj(getattr(value, f.name)) for f in dataclasses.fields(value))]
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
    if cls is None or not any(issubclass(cls, base) for base in allowed):
        names = ", ".join(base.__name__ for base in allowed)
        raise StateCodecError(f"tag {obj[0]} is not a record of type {names}")
    hints = _hints(cls)
    given = len(obj) - 1
    if given > len(hints):
        raise StateCodecError(
            f"{cls.__name__}: {given} fields, but this version knows {len(hints)}: it was "
            "written by a newer version of rallypoint (upgrade this member)"
        )
    if given < _required_fields(cls):
        raise StateCodecError(f"{cls.__name__}: expected {len(hints)} fields, got {given}")
    kwargs = {}
    # Fields added later are trailing and have defaults: older records decode with them.
    for (name, hint), field_obj in zip(hints, obj[1:], strict=False):
        try:
            kwargs[name] = from_obj(field_obj, hint)
        except StateCodecError as exc:
            raise StateCodecError(f"{cls.__name__}.{name}: {exc}") from None
    return cls(**kwargs)


_REQUIRED: dict[type[Any], int] = {}


def _required_fields(cls: type[Any]) -> int:
    """How many leading fields a record of ``cls`` must carry: those without a default."""
    count = _REQUIRED.get(cls)
    if count is None:
        count = 0
        for f in dataclasses.fields(cls):
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                count += 1
        _REQUIRED[cls] = count
    return count


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
        item_hint = typing.get_args(hint)[0]
        if not isinstance(obj, list):
            raise StateCodecError(f"expected an array, got {obj!r}"[:300])
        return tuple(from_obj(item, item_hint) for item in obj)
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
