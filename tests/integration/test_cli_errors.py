"""The command line's failures, as a person meets them: bad inputs, and endpoints where no
member is, or something else is (a member's peer port, a server that is not gRPC, one that
never answers). Each row runs ``rallypoint`` as its own process against a real member and
expects one line on stderr, in our words: no traceback, none of gRPC's vocabulary."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .harness import free_ports, running_cluster

pytestmark = pytest.mark.integration

COMMAND = [sys.executable, "-m", "rallypoint.coordinator"]
# What a failure line must never show: a traceback, or gRPC's words.
NOISE = ("Traceback", "ipv4:", "ipv6:", "UNKNOWN:", "UNAVAILABLE:", "grpc", "SSL_ERROR", "E0000")


@dataclass
class Places:
    """Addresses the rows point at ({client}, {peer}, ... in their arguments)."""

    client: str
    peer: str
    nothing: str
    nothing_2: str
    http: str
    closing: str
    silent: str

    def fill(self, argument: str) -> str:
        return argument.format(**vars(self))


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def _serve(handle: object) -> tuple[str, socket.socket]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            if handle == "close":
                connection.close()
            else:
                held.append(connection)  # accepted, never answered

    threading.Thread(target=accept, daemon=True).start()
    return f"127.0.0.1:{listener.getsockname()[1]}", listener


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Places]:
    root = tmp_path_factory.mktemp("cli-errors")
    http_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    threading.Thread(target=http_server.serve_forever, daemon=True).start()
    closing, closing_socket = _serve("close")
    silent, silent_socket = _serve("hold")
    with running_cluster(root, 1, tick_ms=50) as cluster:
        member = cluster.members[1]
        nothing, nothing_2 = free_ports(2)
        yield Places(
            client=member.client_address,
            peer=member.peer_address,
            nothing=f"127.0.0.1:{nothing}",
            nothing_2=f"127.0.0.1:{nothing_2}",
            http=f"127.0.0.1:{http_server.server_address[1]}",
            closing=closing,
            silent=silent,
        )
    http_server.shutdown()
    http_server.server_close()
    closing_socket.close()
    silent_socket.close()


def rallypoint(*argv: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RALLYPOINT_", "GRPC_"))}
    return subprocess.run(
        [*COMMAND, *argv], capture_output=True, text=True, timeout=timeout_s, env=env
    )


# (arguments, exit code, the one line on stderr starts with, and contains)
ROWS = [
    # No member where the endpoint points.
    (
        ["kv", "get", "k", "--endpoints", "{nothing}", "--timeout", "1"],
        1,
        "error: UnavailableError: no member answered at {nothing} (connection refused): is a "
        "member running there, and is that its client port?",
        "",
    ),
    (
        ["kv", "get", "k", "--endpoints", "{nothing},{nothing_2}", "--timeout", "1"],
        1,
        "error: UnavailableError: no member answered within 1 s ({nothing}: connection "
        "refused; {nothing_2}: connection refused)",
        "",
    ),
    # A member's peer port, not its client port.
    (
        ["kv", "get", "k", "--endpoints", "{peer}"],
        1,
        "error: WrongEndpointError: {peer} is a member's peer port, not its client port",
        "--client-address",
    ),
    (
        ["lease", "grant", "10", "--endpoints", "{peer}"],
        1,
        "error: WrongEndpointError: {peer} is a member's peer port, not its client port",
        "",
    ),
    # Servers that are not members.
    (
        ["kv", "get", "k", "--endpoints", "{http}", "--timeout", "2"],
        1,
        "error: WrongEndpointError: {http} is not a rallypoint member",
        "is that a member's client port",
    ),
    (
        ["kv", "get", "k", "--endpoints", "{closing}", "--timeout", "1"],
        1,
        "error: UnavailableError: {closing} closed the connection before answering",
        "",
    ),
    (
        ["kv", "get", "k", "--endpoints", "{silent}", "--timeout", "1"],
        1,
        "error: UnavailableError: {silent} accepted the connection but never answered",
        "paused",
    ),
    (
        [
            "kv",
            "get",
            "k",
            "--endpoints",
            "{client}",
            "--tls-ca-file",
            "/dev/null",
            "--timeout",
            "1",
        ],
        1,
        "error: WrongEndpointError: the TLS handshake with {client} failed",
        "",
    ),
    (
        ["kv", "get", "k", "--endpoints", "no-such-host.invalid:2379", "--timeout", "1"],
        1,
        "error: UnavailableError: cannot resolve the host of no-such-host.invalid:2379",
        "",
    ),
    # Every member down: status lists each endpoint (the table is on stdout). A refused
    # connection answers at once; the timeout only bounds a loaded machine's scheduling.
    (
        ["status", "--endpoints", "{nothing},{nothing_2}", "--timeout", "5"],
        1,
        "error: no endpoint answered ({nothing}: connection refused; {nothing_2}: connection "
        "refused): is the cluster running",
        "",
    ),
    # Endpoints without a port, or with a bad one: refused before anything is dialled.
    (
        ["kv", "get", "k", "--endpoints", "localhost"],
        2,
        "rallypoint kv get: error: argument --endpoints: endpoint 'localhost' has no port: "
        "write host:port, e.g. localhost:2379",
        "",
    ),
    (
        ["status", "--endpoints", "127.0.0.1:99999"],
        2,
        "rallypoint status: error: argument --endpoints: endpoint '127.0.0.1:99999': the port "
        "must be a number from 1 to 65535",
        "",
    ),
    # Numbers: bad ones, negative ones.
    (
        ["lease", "grant", "-5", "--endpoints", "{client}"],
        2,
        "rallypoint lease grant: error: argument ttl: must be at least 0.001 seconds, got -5",
        "",
    ),
    (
        # 2^63-1 ms was granted before; a member refuses more than 7 days (defaults.py).
        ["lease", "grant", "9223372036854775807", "--endpoints", "{client}"],
        2,
        "rallypoint lease grant: error: argument ttl: must be at most 604800 seconds, got "
        "9223372036854775807",
        "",
    ),
    (
        ["lease", "grant", "ten", "--endpoints", "{client}"],
        2,
        "rallypoint lease grant: error: argument ttl: 'ten' is not a number of seconds",
        "",
    ),
    (
        ["kv", "get", "k", "--timeout", "0", "--endpoints", "{client}"],
        2,
        "rallypoint kv get: error: argument --timeout: must be at least 0.001 seconds, got 0",
        "",
    ),
    (
        ["kv", "get", "k", "--prefix", "--limit", "-1", "--endpoints", "{client}"],
        2,
        "rallypoint kv get: error: argument --limit: must be 0 or more, got -1",
        "",
    ),
    (
        ["lease", "revoke", "0", "--endpoints", "{client}"],
        2,
        "rallypoint lease revoke: error: argument lease_id: must be 1 or more, got 0",
        "",
    ),
    (
        ["member", "remove", "x1", "--endpoints", "{client}"],
        2,
        "rallypoint member remove: error: argument member_id: 'x1' is not a whole number",
        "",
    ),
    (
        ["jobs", "prune", "--keep", "-2", "--endpoints", "{client}"],
        2,
        "rallypoint jobs prune: error: argument --keep: must be 0 or more, got -2",
        "",
    ),
    (
        ["cluster", "up", "--nodes", "12"],
        2,
        "rallypoint cluster up: error: argument --nodes: must be from 1 to 9, got 12",
        "",
    ),
    # Usage mistakes.
    (
        ["lease", "grant"],
        2,
        "rallypoint lease grant: error: the following arguments are required: ttl",
        "",
    ),
    (["kvv"], 2, "rallypoint: error: argument COMMAND: invalid choice: 'kvv'", ""),
    # A member's own refusal.
    (
        ["rounds", "no-such-job", "--endpoints", "{client}"],
        1,
        "error: JobNotFoundError: ",
        "JOB_NOT_FOUND",
    ),
    (
        ["lease", "revoke", "424242", "--endpoints", "{client}"],
        1,
        "error: LeaseNotFoundError: ",
        "",
    ),
]


@pytest.mark.parametrize(
    ("argv", "code", "starts", "contains"),
    ROWS,
    ids=[
        "no member there",
        "no member at either endpoint",
        "a peer port",
        "a peer port, a write",
        "an HTTP server",
        "a server that closes",
        "a server that never answers",
        "TLS to a plaintext member",
        "an unknown host",
        "status, every member down",
        "a missing port",
        "a port out of range",
        "a negative TTL",
        "a TTL past 7 days",
        "a TTL that is no number",
        "a zero timeout",
        "a negative limit",
        "lease id 0",
        "a member id that is no number",
        "a negative keep",
        "too many nodes",
        "a missing argument",
        "an unknown command",
        "a job that does not exist",
        "a lease that does not exist",
    ],
)
def test_a_failure_is_one_line_in_our_words(
    places: Places, argv: list[str], code: int, starts: str, contains: str
) -> None:
    result = rallypoint(*(places.fill(a) for a in argv))
    lines = result.stderr.strip().splitlines()
    assert (result.returncode, len(lines)) == (code, 1), result.stderr
    line = lines[0]
    assert line.startswith(places.fill(starts)), line
    assert contains in line, line
    for noise in NOISE:
        assert noise.lower() not in line.lower(), line


def test_every_member_down_still_lists_each_endpoint(places: Places) -> None:
    result = rallypoint("status", "--endpoints", places.fill("{nothing},{nothing_2}"), "--json")
    assert result.returncode == 1
    rows = json.loads(result.stdout)["members"]
    assert [(r["client_address"], r["health"]) for r in rows] == [
        (places.nothing, "unreachable"),
        (places.nothing_2, "unreachable"),
    ]
    table = rallypoint("status", "--endpoints", places.fill("{nothing},{nothing_2}")).stdout
    assert places.nothing in table and places.nothing_2 in table
    assert table.count("unreachable: connection refused") == 2


def test_a_reader_that_goes_away_stops_the_output_quietly(places: Places) -> None:
    # `status --json | head` ended with "error: BrokenPipeError". A pipe whose read end is
    # closed before the command writes: every write to it fails, as after head exits.
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RALLYPOINT_", "GRPC_"))}
    try:
        done = subprocess.run(
            [*COMMAND, "status", "--json", "--endpoints", places.fill("{nothing}")],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env=env,
        )
    finally:
        os.close(write_end)
    # As a Unix tool killed by SIGPIPE: nothing said, status 128 + 13.
    assert (done.returncode, done.stderr) == (141, ""), done.stderr


def test_debug_adds_the_transport_words_on_a_second_line(places: Places) -> None:
    result = rallypoint("kv", "get", "k", "--endpoints", places.peer, "--debug")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 2
    # A peer port closes a gRPC connection at its first bytes.
    assert lines[1] == (
        f"debug: gRPC status UNAVAILABLE from {places.peer}: failed to connect to all "
        f"addresses; last error: UNAVAILABLE: ipv4:{places.peer}: Socket closed"
    )


def test_version(places: Places) -> None:
    result = rallypoint("--version")
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("rallypoint ") and result.stdout.strip() != "rallypoint"


def test_a_good_command_still_works(places: Places, tmp_path: Path) -> None:
    put = rallypoint("kv", "put", "greeting", "hello", "--endpoints", places.client)
    assert (put.returncode, put.stderr) == (0, "")
    granted = rallypoint("lease", "grant", "0.5", "--endpoints", places.client, "--json")
    assert granted.returncode == 0 and '"ttl_s": 0.5' in granted.stdout
