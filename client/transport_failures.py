"""What each transport failure is, in our words: the table :func:`errors.map_rpc_error` reads.

A status without a member's reason was made by gRPC (or by a server that is not a member);
its text, gRPC's own ("failed to connect to all addresses; last error: UNKNOWN: ipv4:...:
Failed to connect to remote host: Connection refused"), is classified here into a
:class:`FailureKind`, and each kind has one sentence: what happened at the endpoint, and what
to check. Only ``errors.py`` uses this module; nothing here raises.
"""

from __future__ import annotations

import enum
import re

import grpc


class FailureKind(enum.Enum):
    """What went wrong between the client and an endpoint (a status without a reason)."""

    REFUSED = "connection refused"
    UNRESOLVED = "host name not found"
    UNREACHABLE = "unreachable"
    TLS = "TLS handshake failed"
    NOT_GRPC = "not a member: another protocol"
    CLOSED = "connection closed before any answer"
    PEER_PORT = "a member's peer port"
    NOT_RALLYPOINT = "no rallypoint API there"
    NO_ANSWER = "no answer in time"
    SILENT = "connected, never answered"
    LOST = "connection lost"
    OTHER = "transport failure"


# (pattern in gRPC's text, kind, how to say it): the first that matches decides. gRPC's core
# words these; they have been stable for years, and an unknown text falls to OTHER. "failed to
# connect to all addresses" prefixes failures before any answer, so a connection closed then
# was never a working one, while the same words after it mean a call that was cut off.
_PATTERNS: list[tuple[re.Pattern[str], FailureKind, str]] = [
    (re.compile(r"connection refused", re.I), FailureKind.REFUSED, "connection refused"),
    (
        re.compile(r"errors resolving|domain name not found|lookup failed", re.I),
        FailureKind.UNRESOLVED,
        "host name not found",
    ),
    (re.compile(r"no route to host", re.I), FailureKind.UNREACHABLE, "no route to host"),
    (re.compile(r"network is unreachable", re.I), FailureKind.UNREACHABLE, "network unreachable"),
    (
        re.compile(r"connection timed out|connect timed out|timed out connecting", re.I),
        FailureKind.UNREACHABLE,
        "connection timed out",
    ),
    (
        re.compile(r"timed out before receiving settings", re.I),
        FailureKind.SILENT,
        "it accepted the connection and never answered",
    ),
    (re.compile(r"handshake|\bssl|\btls\b|certificate", re.I), FailureKind.TLS, "TLS"),
    (
        re.compile(r"failed parsing http/2|http1|settings frame", re.I),
        FailureKind.NOT_GRPC,
        "it answered in another protocol",
    ),
    (
        re.compile(r"failed to connect to all addresses.*(socket closed|connection reset)", re.I),
        FailureKind.CLOSED,
        "it closed the connection before answering",
    ),
    (
        re.compile(
            r"stream removed|socket closed|connection reset|broken pipe|goaway|rst_stream|"
            r"\beof\b|endpoint closing",
            re.I,
        ),
        FailureKind.LOST,
        "connection lost during the call",
    ),
]

# What to check, per kind: said of one endpoint ("there") or of several ("there" too: the
# list of endpoints comes first).
_CHECKS: dict[FailureKind, str] = {
    FailureKind.REFUSED: "is a member running there, and is that its client port?",
    FailureKind.UNRESOLVED: "is the host name spelled right, and does this machine's DNS know it?",
    FailureKind.UNREACHABLE: "is the host up, and does the network (a firewall) let this "
    "machine reach that port?",
    FailureKind.TLS: "do this client and the member agree on TLS (the client's CA file, the "
    "member's --tls-cert-file), and does that CA sign the member's certificate?",
    FailureKind.NOT_GRPC: "is that a member's client port (its --client-address)?",
    FailureKind.CLOSED: "is that a member's client port, and does the member expect TLS "
    "while this client does not use it?",
    FailureKind.PEER_PORT: "clients use the member's client port (its --client-address; "
    "`rallypoint member list` shows both)",
    FailureKind.NOT_RALLYPOINT: "is that a member's client port, and does the member run a "
    "rallypoint as new as this client?",
    FailureKind.NO_ANSWER: "is the member paused or overloaded, or does a firewall drop the "
    "traffic?",
    FailureKind.SILENT: "is the member paused or overloaded, or is that not a member's client "
    "port?",
    FailureKind.LOST: "the member may have stopped or restarted; the client tries again",
    FailureKind.OTHER: "is a rallypoint member serving clients there?",
}

# The transport's words around the part worth keeping: "failed to connect to all addresses;
# last error: UNKNOWN: ipv4:127.0.0.1:443: <the part>".
_NOISE = re.compile(
    r"failed to connect to all addresses; last error: |\b[A-Z_]{4,}: |ipv[46]:\S+?: |"
    r"\[?field:hostname lookup error:|\]$"
)


def classify(code: grpc.StatusCode, details: str) -> tuple[FailureKind, str] | None:
    """The transport failure a reasonless status stands for, in words; None when it is a
    server's own answer (a status gRPC does not make by itself)."""
    if code is grpc.StatusCode.UNIMPLEMENTED:
        match = re.search(r"http2 header with status: *(\d+)", details, re.I)
        if match:
            return FailureKind.NOT_GRPC, f"it answered HTTP status {match.group(1)}"
        return FailureKind.NOT_RALLYPOINT, "its server lacks rallypoint's methods"
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return FailureKind.NO_ANSWER, "no answer in time"
    if code not in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.CANCELLED,
    ):
        return None
    for pattern, kind, words in _PATTERNS:
        if pattern.search(details):
            return kind, words
    if code is grpc.StatusCode.CANCELLED:
        return FailureKind.LOST, "the call was cut off"
    if code is grpc.StatusCode.UNAVAILABLE and ("ipv4:" in details or "ipv6:" in details):
        return FailureKind.OTHER, _NOISE.sub("", details).strip() or "cannot connect"
    return None


# What happened, per kind, with {endpoint}, {words} (the detail in words) and {within}.
_SAYINGS: dict[FailureKind, str] = {
    FailureKind.REFUSED: "no member answered at {endpoint} (connection refused)",
    FailureKind.UNRESOLVED: "cannot resolve the host of {endpoint} (host name not found)",
    FailureKind.UNREACHABLE: "cannot reach {endpoint} ({words})",
    FailureKind.TLS: "the TLS handshake with {endpoint} failed",
    FailureKind.NOT_GRPC: "{endpoint} is not a rallypoint member ({words})",
    FailureKind.CLOSED: "{endpoint} closed the connection before answering",
    FailureKind.PEER_PORT: "{endpoint} is a member's peer port, not its client port",
    FailureKind.NOT_RALLYPOINT: "{endpoint} answers, but not with rallypoint's client API",
    FailureKind.NO_ANSWER: "{endpoint} did not answer {within}",
    FailureKind.SILENT: "{endpoint} accepted the connection but never answered",
    FailureKind.LOST: "the connection to {endpoint} was lost during the call",
    FailureKind.OTHER: "cannot use {endpoint} ({words})",
}


def transport_message(
    kind: FailureKind, endpoint: str, words: str, *, timeout_s: float | None = None
) -> str:
    """The sentence for one endpoint's transport failure: what happened, what to check."""
    within = f"within {timeout_s:.3g} s" if timeout_s is not None else "in time"
    said = _SAYINGS[kind].format(endpoint=endpoint, words=words, within=within)
    return f"{said}: {_CHECKS[kind]}"


def check_for(kind: FailureKind) -> str:
    """What to check after a failure of ``kind``."""
    return _CHECKS[kind]
