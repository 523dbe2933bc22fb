"""The dashboard without a browser: its HTTP surface, its documents, its live stream.

- The HTTP layer alone (no cluster): a request it cannot parse is a 400, another method a
  405, an unknown path a 404, each one line; an infinite phi stays readable JSON.
- Against a real 3-member cluster with two participants joined by the client library: the
  JSON endpoints return the CLI's ``--json`` documents (``jobs``, ``rounds JOB``), an
  eviction reaches ``/events`` as the next round without polling the API, a member killed
  shows as unreachable while everything else is still served, an unknown job is a 404.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest

from rallypoint.client import (
    Client,
    JobConfig,
    JobNotFoundError,
    RoundInfo,
    RoundState,
    SyncClient,
)
from rallypoint.coordinator.cli.dashboard_http import (
    HttpError,
    Response,
    json_bytes,
    json_response,
    serve,
)
from rallypoint.coordinator.cli.main import main as rallypoint_main
from tests.integration.harness import ProcessCluster, running_cluster, wait_until

from .processes import dashboard

JOB = "watched"
CONFIG = JobConfig(min_nodes=2, max_nodes=2, heartbeat_interval_ms=100, acceptable_pause_ms=500)


# ---------------------------------------------------------------------------- HTTP alone


async def exchange(request: bytes) -> bytes:
    async def handler(path: str, query: dict[str, str]) -> Response:
        if path == "/ok":
            return json_response({"phi": math.inf, "query": query})
        raise HttpError(HTTPStatus.NOT_FOUND, f"no page {path!r}")

    server = await asyncio.start_server(serve(handler), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return answer


def split(answer: bytes) -> tuple[str, bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode(), body


async def test_requests_it_cannot_serve_get_a_status_and_one_line() -> None:
    status, body = split(await exchange(b"garbage\r\n\r\n"))
    assert status == "HTTP/1.1 400 Bad Request" and body.count(b"\n") == 1, body
    status, body = split(await exchange(b"POST /ok HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert status == "HTTP/1.1 405 Method Not Allowed" and body.count(b"\n") == 1, body
    status, body = split(await exchange(b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert status == "HTTP/1.1 404 Not Found" and body == b"no page '/nowhere'\n"
    status, body = split(await exchange(b"GET /ok?a=b%20c HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert status == "HTTP/1.1 200 OK"
    assert json.loads(body) == {"phi": "Infinity", "query": {"a": "b c"}}
    status, body = split(await exchange(b"HEAD /ok HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert status == "HTTP/1.1 200 OK" and body == b""


def test_non_finite_numbers_become_words_every_json_reader_takes() -> None:
    document = {"a": [math.inf, -math.inf, 1.5], "b": {"c": math.nan}}
    assert json.loads(json_bytes(document)) == {
        "a": ["Infinity", "-Infinity", 1.5],
        "b": {"c": "NaN"},
    }


# ---------------------------------------------------------------------------- a real cluster


def get(base: str, path: str) -> Any:
    with urllib.request.urlopen(base + path, timeout=5) as response:
        return json.load(response)


def cli_json(cluster: ProcessCluster, capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    capsys.readouterr()
    code = rallypoint_main([*argv, "--json", "--endpoints", ",".join(cluster.endpoints)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


class EventReader:
    """``/events`` read as a browser would, over a plain socket, with a deadline per read."""

    def __init__(self, base: str) -> None:
        host, port = base.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.sock.sendall(b"GET /events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
        self.buffer = b""

    def next_event(self, deadline: float) -> tuple[str, Any]:
        while b"\n\n" not in self.buffer:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.sock.recv(65536)
            assert chunk, "the event stream ended"
            self.buffer += chunk
        block, self.buffer = self.buffer.split(b"\n\n", 1)
        fields = dict(line.split(": ", 1) for line in block.decode().split("\n") if ": " in line)
        return fields.get("event", ""), json.loads(fields["data"]) if "data" in fields else None

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    with running_cluster(tmp_path / "cluster") as running:
        yield running


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_the_api_serves_the_clis_documents_and_follows_changes(
    cluster: ProcessCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with (
        SyncClient(cluster.endpoints) as client,
        dashboard(cluster.endpoints, tmp_path) as base,
    ):
        first = client.join(JOB, "alpha", config=CONFIG, metadata=b"host-a")
        second = client.join(JOB, "beta", config=CONFIG, metadata=b"host-b")
        wait_until(
            lambda: (j := get(base, "/api/jobs")["jobs"]) and j[0]["state"] == "active",
            30,
            "the dashboard to show the job active",
        )
        # The same documents as the CLI's --json (once the dashboard has caught up).
        assert wait_until(
            lambda: get(base, "/api/jobs")["jobs"] == cli_json(cluster, capsys, "jobs")["jobs"],
            30,
            "/api/jobs to equal `rallypoint jobs --json`",
        )
        rounds = cli_json(cluster, capsys, "rounds", JOB)
        served = wait_until(
            lambda: (
                (doc := get(base, f"/api/jobs/{JOB}"))["round"]["job_revision"]
                == rounds["round"]["job_revision"]
                and doc
            ),
            30,
            f"/api/jobs/{JOB} at the revision `rounds` saw",
        )
        live = {"phi", "heartbeat_age_ms", "step", "step_ms", "step_ratio"}
        for document in (served, rounds):
            for member in document["round"]["members"]:
                assert live <= set(member)
                for key in live:
                    del member[key]
        assert {k: served[k] for k in rounds} == rounds
        assert served["round"]["members"][0]["metadata"] == "host-a"
        assert set(served["phi_history"]) == {str(first.participant_id), str(second.participant_id)}

        # An eviction arrives over the event stream as the next round.
        events = EventReader(base)
        try:
            before = served["round"]["round"]
            client.evict(JOB, second.participant_id)
            deadline = time.monotonic() + 30
            while True:
                name, data = events.next_event(deadline)
                if name == "job" and data["round"]["round"] > before and data["history"]:
                    break
            ended = data["history"][-1]
            assert (ended["round"], ended["end_reason"], ended["ended_by"]) == (
                before,
                "member_evicted",
                second.participant_id,
            )
        finally:
            events.close()

        # A member down: shown unreachable, the rest still served.
        follower = next(m for m in cluster.members if m != cluster.leader())
        cluster.kill(follower)
        row = wait_until(
            lambda: next(
                (
                    m
                    for m in get(base, "/api/cluster")["members"]
                    if m["id"] == follower and m["health"] == "unreachable"
                ),
                None,
            ),
            30,
            f"member {follower} shown unreachable",
        )
        assert row["error"]
        assert get(base, "/api/jobs")["jobs"][0]["job"] == JOB

        # An unknown job: 404, one line.
        with pytest.raises(urllib.error.HTTPError) as refused:
            get(base, "/api/jobs/nope")
        assert refused.value.code == 404
        assert refused.value.read() == f"no job 'nope' (jobs: {JOB})\n".encode()
        first.leave()


@pytest.mark.integration
@pytest.mark.timeout(240)
async def test_watch_job_follows_rounds_across_a_member_failure(cluster: ProcessCluster) -> None:
    """What feeds the dashboard: ``Client.watch_job`` yields the current round, then each
    change, still after the member it watched through is killed; an unknown job ends it."""
    follower = next(m for m in cluster.members if m != cluster.leader())
    watched = cluster.members[follower].client_address
    # The watch opens on the first endpoint: the follower that is killed below.
    order = [watched, *(e for e in cluster.endpoints if e != watched)]
    async with (
        Client(order, timeout_s=10, open_session_on_connect=False) as watcher,
        Client(cluster.endpoints, timeout_s=10) as workers,
    ):
        first = await workers.join(JOB, "alpha", config=CONFIG)
        await workers.join(JOB, "beta", config=CONFIG)
        rounds = watcher.watch_job(JOB)

        async def next_active(after: int) -> RoundInfo:
            async with asyncio.timeout(30):
                async for info in rounds:
                    if info.round > after and info.state is RoundState.ACTIVE:
                        return info
            raise AssertionError("the watch ended")

        active = await next_active(0)
        assert active.world_size == 2
        cluster.kill(follower)
        third = await workers.join(JOB, "gamma", config=CONFIG)
        await workers.evict(JOB, first.participant_id)
        changed = await next_active(active.round)
        assert [m.name for m in changed.members] == ["beta", "gamma"]
        assert third.participant_id in {m.participant_id for m in changed.members}
        await rounds.aclose()
        with pytest.raises(JobNotFoundError):
            async for _ in watcher.watch_job("nope"):
                pass


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_with_every_member_down_it_keeps_serving_and_says_so(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    with dashboard(cluster.endpoints, tmp_path) as base:
        wait_until(
            lambda: any(m["is_leader"] for m in get(base, "/api/cluster")["members"]),
            30,
            "the dashboard to see a leader",
        )
        for member_id in cluster.members:
            cluster.kill(member_id)
        down = wait_until(
            lambda: (doc := get(base, "/api/cluster"))["error"] and doc,
            30,
            "the dashboard to report the cluster down",
        )
        assert down["error"].startswith("no member answered: ")
        assert {m["health"] for m in down["members"]} == {"unreachable"}
        assert sorted(m["id"] for m in down["members"]) == sorted(cluster.members)
        assert wait_until(lambda: get(base, "/api/jobs")["error"], 30, "the jobs' error")
        with urllib.request.urlopen(base + "/", timeout=5) as page:
            assert b"<title>rallypoint dashboard</title>" in page.read()
