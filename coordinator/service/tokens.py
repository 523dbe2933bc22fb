"""Bearer tokens and their roles: the tokens file, and the table a member checks calls against.

The tokens file (``rallypoint serve --tokens-file PATH``) is TOML, one ``[[token]]`` table
per credential::

    [[token]]
    name = "training-resnet"   # optional: names the entry in logs and errors
    role = "job:resnet"        # admin, read, or job:<job id>
    sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

``sha256`` is the hex SHA-256 of the token (``printf %s "$TOKEN" | sha256sum``): the file
holds no secret, so it may be readable by more than the member, kept in configuration
management, and shown in reviews. A client sends the token itself (``authorization: Bearer
TOKEN``); the member hashes what it is sent and looks the digest up. ``--auth-token`` (the
one shared token of earlier versions) is one more ``admin`` entry.

Theory of operation. A :class:`TokenTable` is immutable. :class:`ClientTokens` holds the
table in use and replaces it whole on :meth:`ClientTokens.reload` (SIGHUP): a call sees the
old table or the new one, never a mix. A file that cannot be read or parsed leaves the
table in use as it was, and the error says which file, entry and field is wrong. A member
started with a tokens file requires a token on every call, even when the file lists none
(then every call is refused): a missing or emptied file never turns authentication off.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections import Counter
from dataclasses import dataclass
from typing import Any

from .authz import Role

_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_ENTRY_KEYS = frozenset({"name", "role", "sha256"})


class TokensFileError(ValueError):
    """A tokens file that cannot be used; the message names the file, entry and field."""


def digest(token: str | bytes) -> bytes:
    """The SHA-256 of a token, as the tokens file lists it (raw bytes here)."""
    return hashlib.sha256(token.encode() if isinstance(token, str) else token).digest()


@dataclass(frozen=True, slots=True)
class Grant:
    """One credential: its name (for logs) and its role."""

    name: str
    role: Role


@dataclass(frozen=True, slots=True)
class TokenTable:
    """Invariant: keys are SHA-256 digests (32 bytes)."""

    grants: dict[bytes, Grant]

    def lookup(self, token: bytes) -> Grant | None:
        return self.grants.get(digest(token))

    def summary(self) -> str:
        """``3 tokens (admin 1, job 2)``: for the log line of a load or reload."""
        if not self.grants:
            return "0 tokens: every call will be refused"
        kinds = Counter(grant.role.kind.value for grant in self.grants.values())
        counts = ", ".join(f"{kind} {kinds[kind]}" for kind in sorted(kinds))
        return f"{len(self.grants)} token{'s' * (len(self.grants) != 1)} ({counts})"


def parse_tokens(data: dict[str, Any], source: str) -> dict[bytes, Grant]:
    """The grants of a parsed tokens file; TokensFileError naming what is wrong."""
    unknown = sorted(set(data) - {"token"})
    if unknown:
        raise TokensFileError(f"{source}: unknown key {unknown[0]!r} (expected [[token]] tables)")
    entries = data.get("token", [])
    if not isinstance(entries, list):
        raise TokensFileError(f"{source}: 'token' must be an array of tables ([[token]])")
    grants: dict[bytes, Grant] = {}
    names: dict[bytes, str] = {}
    for number, entry in enumerate(entries, start=1):
        where = f"{source}: token {number}"
        if not isinstance(entry, dict):
            raise TokensFileError(f"{where}: expected a table with role and sha256")
        extra = sorted(set(entry) - _ENTRY_KEYS)
        if extra:
            raise TokensFileError(f"{where}: unknown key {extra[0]!r} (keys: name, role, sha256)")
        name = entry.get("name", f"token {number}")
        role_text, hex_digest = entry.get("role"), entry.get("sha256")
        if not isinstance(name, str):
            raise TokensFileError(f"{where}: name must be a string")
        if not isinstance(role_text, str):
            raise TokensFileError(f"{where} ({name}): role is missing or not a string")
        try:
            role = Role.parse(role_text)
        except ValueError as exc:
            raise TokensFileError(f"{where} ({name}): {exc}") from None
        if not isinstance(hex_digest, str) or not _HEX_DIGEST.fullmatch(hex_digest.lower()):
            raise TokensFileError(
                f"{where} ({name}): sha256 must be 64 hex digits, the SHA-256 of the token "
                '(printf %s "$TOKEN" | sha256sum)'
            )
        key = bytes.fromhex(hex_digest)
        if key in grants:
            raise TokensFileError(f"{where} ({name}): same sha256 as {names[key]}")
        grants[key], names[key] = Grant(name, role), f"token {number} ({name})"
    return grants


def load_tokens_file(path: str) -> dict[bytes, Grant]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise TokensFileError(f"tokens file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise TokensFileError(f"tokens file {path}: not valid TOML: {exc}") from None
    return parse_tokens(data, f"tokens file {path}")


class ClientTokens:
    """The tokens a member accepts: ``admin_token`` (``--auth-token``) and the entries of
    ``path`` (``--tokens-file``), reloadable. Raises TokensFileError when the file is bad."""

    def __init__(self, *, admin_token: str | None = None, path: str | None = None) -> None:
        self.path = path
        self._admin_token = admin_token
        self.table = self._load()

    def _load(self) -> TokenTable:
        grants = load_tokens_file(self.path) if self.path else {}
        if self._admin_token:
            key = digest(self._admin_token)
            if key in grants:
                raise TokensFileError(
                    f"tokens file {self.path}: {grants[key].name} has the --auth-token's "
                    "sha256; list it once"
                )
            grants[key] = Grant("--auth-token", Role.parse("admin"))
        return TokenTable(grants)

    def lookup(self, token: bytes) -> Grant | None:
        return self.table.lookup(token)

    def reload(self) -> str:
        """Read the file again and use it from the next call on; the new table's summary.
        On TokensFileError the table in use stays."""
        self.table = self._load()
        return self.table.summary()
