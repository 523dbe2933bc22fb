"""How the store's Add reads and writes a counter: decimal ASCII in a signed 64-bit range.

kv.proto (``Add``) and rendezvous.proto (``StoreAdd``) state the format: a counter is ASCII
digits with an optional leading minus (torch c10d's ``add``); a missing key counts as 0; an
Add on a value that is not such a number is NOT_AN_INTEGER, one whose sum leaves the signed
64-bit range is ADD_OVERFLOW. The range applies to the sum, not to the value read (a value
set past it may still be added back into it). The state machine decides with these, and the
TCPStore bridge answers an ADD of 0 from a read with them, so both read a counter alike.

This module imports nothing: it is part of the wire contract, below the client and the
coordinator alike.
"""

from __future__ import annotations

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def parse_counter(value: bytes) -> int | None:
    """``value`` as a counter (ASCII digits, an optional leading minus), else None."""
    digits = value[1:] if value.startswith(b"-") else value
    # bytes.isdigit() is true for ASCII digits only.
    return int(value) if digits and digits.isdigit() else None


def fits_int64(number: int) -> bool:
    """Whether ``number`` is within the signed 64-bit range a counter holds."""
    return INT64_MIN <= number <= INT64_MAX
