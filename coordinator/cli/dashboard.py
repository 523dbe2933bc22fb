"""``rallypoint dashboard``: a live web page of the cluster and its jobs, served by a client.

Theory of operation. The dashboard is a client of the cluster like the other commands
(never a web server inside a member): one :class:`Client`, one :class:`Hub` that keeps the
latest documents, and a small HTTP server (``dashboard_http``) that hands them out. The
documents are the CLI's own, built by the same functions: ``/api/cluster`` is ``status
--json`` (plus the leader changes seen), ``/api/jobs`` is ``jobs --json`` and
``/api/jobs/JOB`` is ``rounds JOB --json`` (plus each participant's phi over the last
minute), so every number on the page means what it means there.

What feeds the hub:

- a watch per open job (``Client.watch_job``): a round change is on the page as soon as the
  cluster pushes it; each message updates the job's row at once, then a ``GetJob`` brings
  its history (each round's end and cause), phi and checkpoint;
- a poll every ``poll_s``: each member's status (health has no watch; a member that does
  not answer is shown unreachable), the job list (jobs created or ended), and ``GetJob`` of
  every open job, whose phi readings are kept for a minute to draw.

Every change is published to the browsers over server-sent events (``/events``): the page
renders from them without reloading, and the browser reconnects by itself if the dashboard
restarts. A failed call never stops the dashboard: the last documents stay, with the error
shown, until the cluster answers again. A browser that reads too slowly to keep up loses its
stream (and reconnects to fresh documents), so it cannot make the dashboard hold memory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import time
from collections import deque
from http import HTTPStatus
from typing import Any

from rallypoint.client import (
    Client,
    JobNotFoundError,
    JobState,
    Member,
    RallypointError,
    Role,
)

from .args import seconds
from .client import SubParsers, _common, make_client, status_document
from .dashboard_http import (
    Event,
    EventStream,
    HttpError,
    Response,
    json_bytes,
    json_response,
    serve,
)
from .dashboard_page import PAGE
from .jobs import _round_document, job_document, jobs_document

log = logging.getLogger(__name__)

PHI_WINDOW_MS = 60_000
LEADER_CHANGES_KEPT = 50
# Events a browser may fall behind by before its stream is dropped.
SUBSCRIBER_BACKLOG = 256
KEEPALIVE_S = 15.0


def wall_ms() -> int:
    return int(time.time() * 1000)


def _open(info: dict[str, Any]) -> bool:
    return not info["job_closed"] and info["job_state"] == JobState.OPEN.value


class Hub:
    """The latest documents and the browsers subscribed to their changes."""

    def __init__(self, client: Client, poll_s: float) -> None:
        self.client = client
        self.poll_s = poll_s
        self.cluster: dict[str, Any] = {"members": [], "leader_changes": [], "error": None}
        self.jobs: dict[str, Any] = {"jobs": [], "error": None}
        # job -> rounds JOB --json, plus "phi_history", "phi_threshold" and "error".
        self.job_docs: dict[str, dict[str, Any]] = {}
        # (job, participant id) -> (wall ms, phi) over the last PHI_WINDOW_MS.
        self._phi: dict[tuple[str, int], deque[tuple[int, float]]] = {}
        self._leader: tuple[int, int] | None = None
        self._members: list[Member] = []
        self._watches: dict[str, asyncio.Task[None]] = {}
        self._refreshing: dict[str, asyncio.Task[None]] = {}
        # Jobs asked to refresh while their refresh ran: one more GetJob after it.
        self._stale: set[str] = set()
        self._subscribers: set[asyncio.Queue[Event | None]] = set()

    # ------------------------------------------------------------------ publishing

    def _publish(self, name: str, document: object) -> None:
        event = Event(name, json_bytes(document))
        for queue in list(self._subscribers):
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                # Too far behind: end its stream; the browser reconnects to fresh documents.
                self._subscribers.discard(queue)
                with contextlib.suppress(asyncio.QueueFull):
                    queue.get_nowait()
                    queue.put_nowait(None)

    async def events(self) -> EventStream:
        """One browser's stream: every current document, then each change."""
        queue: asyncio.Queue[Event | None] = asyncio.Queue(SUBSCRIBER_BACKLOG)
        self._subscribers.add(queue)
        try:
            yield Event("cluster", json_bytes(self.cluster))
            yield Event("jobs", json_bytes(self.jobs))
            for document in list(self.job_docs.values()):
                yield Event("job", json_bytes(document))
            while True:
                try:
                    async with asyncio.timeout(KEEPALIVE_S):
                        event = await queue.get()
                except TimeoutError:
                    yield Event("")
                    continue
                if event is None:
                    return
                yield event
        finally:
            self._subscribers.discard(queue)

    # ------------------------------------------------------------------ the cluster

    async def poll_forever(self) -> None:
        while True:
            await asyncio.gather(self.poll_cluster(), self.poll_jobs())
            await asyncio.sleep(self.poll_s)

    async def poll_cluster(self) -> None:
        statuses = await self.client.status(timeout_s=self.poll_s)
        error = None
        # Without an answer, the members last listed: the rows keep their ids and names.
        members = self._members
        if any(s.status is not None for s in statuses):
            try:
                members = await self.client.member_list(serializable=True, timeout_s=self.poll_s)
            except RallypointError as failure:
                error = f"no member list: {failure}"
            self._members = members
        else:
            error = "no member answered: " + "; ".join(
                f"{s.endpoint}: {s.failure or s.error}" for s in statuses
            )
        self.cluster["members"] = status_document(statuses, members)
        self.cluster["error"] = error
        self._note_leader(statuses)
        self._publish("cluster", self.cluster)

    def _note_leader(self, statuses: list[Any]) -> None:
        """Record a leader change: the leader with the highest term any member reports."""
        leaders = [
            (s.status.term, s.status.member_id)
            for s in statuses
            if s.status is not None and s.status.role is Role.LEADER
        ]
        current = max(leaders) if leaders else None
        if current == self._leader or (current is None and self._leader is None):
            return
        self._leader = current
        change = {
            "at_ms": wall_ms(),
            "leader_id": current[1] if current else None,
            "term": current[0] if current else None,
        }
        changes: list[dict[str, Any]] = self.cluster["leader_changes"]
        changes.append(change)
        del changes[:-LEADER_CHANGES_KEPT]

    # ------------------------------------------------------------------ jobs

    async def poll_jobs(self) -> None:
        try:
            infos = await self.client.list_jobs(timeout_s=self.poll_s)
        except RallypointError as failure:
            self.jobs["error"] = str(failure)
            self._publish("jobs", self.jobs)
            return
        self.jobs = {**jobs_document(infos), "error": None}
        self._publish("jobs", self.jobs)
        names = {info.job for info in infos}
        for job in [job for job in self.job_docs if job not in names]:
            del self.job_docs[job]
            self._publish("job_gone", {"job": job})
        for key in [key for key in self._phi if key[0] not in names]:
            del self._phi[key]
        for document in self.jobs["jobs"]:
            job = document["job"]
            if _open(document):
                if job not in self._watches or self._watches[job].done():
                    self._watches[job] = asyncio.create_task(self._watch(job))
                self.refresh_job(job)
            elif job not in self.job_docs or _open(self.job_docs[job]["round"]):
                self.refresh_job(job)  # once more, to show how it ended
        for job in [job for job in self._watches if job not in names]:
            self._watches.pop(job).cancel()

    async def _watch(self, job: str) -> None:
        try:
            async for info in self.client.watch_job(job):
                row = _round_document(info)
                rows = self.jobs["jobs"]
                self.jobs["jobs"] = [row if r["job"] == job else r for r in rows]
                self._publish("jobs", self.jobs)
                self.refresh_job(job)
                if not _open(row):
                    return
        except JobNotFoundError:
            return
        except RallypointError as failure:
            log.warning("watch of job %s ended: %s", job, failure)

    def refresh_job(self, job: str) -> None:
        """GetJob of ``job`` soon, one at a time per job: asked while one runs, one more
        follows it (however many asked), so the newest state is always fetched."""
        running = self._refreshing.get(job)
        if running is not None and not running.done():
            self._stale.add(job)
            return
        task = asyncio.create_task(self._refresh(job))
        self._refreshing[job] = task

        def again(_: asyncio.Task[None]) -> None:
            if job in self._stale and not task.cancelled():
                self._stale.discard(job)
                self.refresh_job(job)

        task.add_done_callback(again)

    async def _refresh(self, job: str) -> None:
        try:
            status = await self.client.get_job(job, timeout_s=max(self.poll_s, 2.0))
        except JobNotFoundError:
            return
        except RallypointError as failure:
            if job in self.job_docs:
                self.job_docs[job]["error"] = str(failure)
                self._publish("job", self.job_docs[job])
            return
        now_ms = wall_ms()
        document = job_document(status)
        history: dict[str, list[tuple[int, float]]] = {}
        for member in status.round.members + status.round.waiting:
            samples = self._phi.setdefault((job, member.participant_id), deque())
            samples.append((now_ms, member.phi))
            while samples and samples[0][0] < now_ms - PHI_WINDOW_MS:
                samples.popleft()
            history[str(member.participant_id)] = list(samples)
        live = {(job, int(pid)) for pid in history}
        for key in [key for key in self._phi if key[0] == job and key not in live]:
            del self._phi[key]
        document["phi_history"] = history
        document["phi_threshold"] = status.config.phi_threshold
        document["error"] = None
        self.job_docs[job] = document
        self._publish("job", document)

    def close(self) -> None:
        for task in [*self._watches.values(), *self._refreshing.values()]:
            task.cancel()

    # ------------------------------------------------------------------ HTTP

    async def handle(self, path: str, query: dict[str, str]) -> Response | EventStream:
        if path == "/":
            return Response(HTTPStatus.OK, "text/html; charset=utf-8", PAGE.encode())
        if path == "/events":
            return self.events()
        if path == "/api/cluster":
            return json_response(self.cluster)
        if path == "/api/jobs":
            return json_response(self.jobs)
        prefix = "/api/jobs/"
        if path.startswith(prefix) and len(path) > len(prefix):
            job = path[len(prefix) :]
            if job not in self.job_docs:
                known = ", ".join(sorted(self.job_docs)) or "none"
                raise HttpError(HTTPStatus.NOT_FOUND, f"no job {job!r} (jobs: {known})")
            return json_response(self.job_docs[job])
        raise HttpError(
            HTTPStatus.NOT_FOUND,
            f"no page {path!r}: try /, /api/cluster, /api/jobs, /api/jobs/JOB or /events",
        )


# ---------------------------------------------------------------------------- the command


def listen_address(text: str) -> tuple[str, int]:
    """``--listen``: HOST:PORT (port 0: any free port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. 127.0.0.1:8080), got {text!r}")
    return host.strip("[]"), int(port)


async def _serve(args: argparse.Namespace) -> int:
    client = make_client(args)
    host, port = args.listen
    async with client:
        hub = Hub(client, args.poll)
        try:
            server = await asyncio.start_server(serve(hub.handle), host, port, limit=64 * 1024)
        except OSError as error:
            print(
                f"error: cannot listen on {host}:{port}: {error.strerror or error}",
                file=sys.stderr,
            )
            return 1
        bound = server.sockets[0].getsockname()
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        print(f"rallypoint dashboard: http://{shown}:{bound[1]}/", flush=True)
        poller = asyncio.create_task(hub.poll_forever())
        serving = asyncio.create_task(server.serve_forever())
        try:
            # The poller only ends by a bug (every expected failure is caught): stop, and say.
            await asyncio.wait({poller, serving}, return_when=asyncio.FIRST_COMPLETED)
            if poller.done():
                poller.result()
        finally:
            for task in (poller, serving):
                task.cancel()
            hub.close()
            server.close()
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_serve(args))
    except KeyboardInterrupt:
        return 0
    except (RallypointError, ValueError, OSError) as error:
        print(f"error: {type(error).__name__}: {' '.join(str(error).split())}", file=sys.stderr)
        return 1


def register(subparsers: SubParsers) -> None:
    """Add ``dashboard`` to the ``rallypoint`` parser."""
    description = (
        "Serve a live web page of the cluster (members, roles, term, commit/applied, "
        "health, leader changes) and its jobs (round, state, world size, why it is not "
        "closing; per job: participants with phi over the last minute, the round history "
        "with each end's cause, each recovery's phases, checkpoints). It is a client of the "
        "cluster: it reads the members' status and follows the jobs' watches; the page "
        "updates by itself (server-sent events). JSON: /api/cluster, /api/jobs, "
        "/api/jobs/JOB (the documents of status, jobs and rounds JOB --json)."
    )
    parser = subparsers.add_parser(
        "dashboard",
        help="serve a live web page of the cluster and its jobs",
        description=description,
        parents=[_common()],
    )
    parser.add_argument(
        "--listen",
        type=listen_address,
        default=("127.0.0.1", 8080),
        help="HOST:PORT to serve the page on (default 127.0.0.1:8080; port 0: any free port)",
    )
    parser.add_argument(
        "--poll",
        type=seconds(least_s=0.05),
        default=1.0,
        help="seconds between status polls and phi readings (default 1)",
    )
    parser.set_defaults(handler=_dashboard)
