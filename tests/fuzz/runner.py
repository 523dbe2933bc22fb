"""The fuzzing run: a real cluster, every RPC of both services in three modes, then checks.

Theory of operation. A 3-member cluster of real processes (tests/integration/harness.py)
starts with ``--auth-token``. A short warm-up makes some state (a session, a lease, a job
with an active round, a round-store key, a checkpoint, keys) and keeps the ids it was given
in the pool, so later requests can name live things. Then targets are fuzzed in batches: a
target is one RPC in one mode ("outsider": public calls without the token and peer calls
without the secret; "client": public calls with the token; "insider": peer calls signed with
the secret, malformed content only). A batch is one hypothesis run of a few examples under
a seed drawn from the run's seed, so a run is reproducible from its seed (up to the values
the cluster hands out, and where the time ran out). The first pass tries every target
once, whatever the time; after it, targets are drawn by mode weight until the time is up.

Every call is judged where it ends (public.py, peer.py); a failure keeps the mode, the RPC,
the batch seed and the request as text. The checks afterwards (checks.py) count as failures
too. The last line printed is ``fuzz: N messages, C failures``.
"""

from __future__ import annotations

import contextlib
import random
import re
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from rallypoint.proto.v1 import (
    common_pb2,
    kv_pb2,
    kv_pb2_grpc,
    lease_pb2,
    lease_pb2_grpc,
    rendezvous_pb2,
    rendezvous_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)
from tests.integration.harness import ProcessCluster, kill_processes_mentioning, wait_until

from . import checks
from .peer import PeerCluster, PeerTarget
from .public import PublicTarget, Verdict
from .raft_messages import PeerView
from .rpcs import peer_rpcs, public_rpcs
from .wire import Pool

TOKEN = "fuzz-client-token"
MODES = ("outsider", "client", "insider")
# The share of batches each mode gets after the first pass; within a mode, targets are
# drawn in proportion to their own weight.
MODE_SHARES = {"outsider": 0.2, "client": 0.5, "insider": 0.3}
FIRST_PASS_EXAMPLES = 3
EXAMPLES_PER_BATCH = 8
# A snapshot every few hundred entries: compaction and snapshot loading run during the fuzz
# and at the restart.
SNAPSHOT_ENTRIES = 300


class Target(Protocol):
    mode: str
    weight: int

    @property
    def name(self) -> str: ...

    def strategy(self) -> st.SearchStrategy[Any]: ...

    def run(self, example: Any) -> Verdict: ...


@dataclass
class Figures:
    """Per target: messages sent, outcomes, and examples not sent (well-formed)."""

    sent: int = 0
    skipped: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)


@dataclass
class Finding:
    mode: str
    rpc: str
    batch_seed: int
    problem: str
    request: str = ""

    @property
    def kind(self) -> str:
        """What findings of one kind share: the status and the exception it names."""
        code = re.search(r"\b(OK|[A-Z]+_[A-Z_]+|UNKNOWN|INTERNAL|UNAVAILABLE)\b", self.problem)
        error = re.search(r"<class '(?:\w+\.)*(\w+)'>|internal error: (\w+)", self.problem)
        named = error and (error.group(1) or error.group(2))
        if not code:
            return self.problem[:40]
        return f"{code.group(1)} {named or ''}".strip()

    def __str__(self) -> str:
        where = f"[{self.mode}] {self.rpc} (batch seed {self.batch_seed})" if self.rpc else ""
        request = f"\n      request: {self.request}" if self.request else ""
        return f"{where}: {self.problem}{request}" if where else f"{self.problem}{request}"


@dataclass
class Report:
    seed: int
    figures: dict[tuple[str, str], Figures] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    batches: int = 0

    @property
    def messages(self) -> int:
        return sum(f.sent for f in self.figures.values())

    def untried(self) -> list[str]:
        return [f"[{mode}] {rpc}" for (mode, rpc), f in self.figures.items() if not f.sent]


def run_batch(
    strategy: st.SearchStrategy[Any], batch_seed: int, examples: int, body: Callable[[Any], None]
) -> None:
    """One hypothesis run of ``examples`` examples, generation only, under ``batch_seed``."""

    @hypothesis_seed(batch_seed)
    @settings(
        database=None,
        max_examples=examples,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        report_multiple_bugs=False,
    )
    @given(strategy)
    def run(example: Any) -> None:
        body(example)

    run()


class Fuzzer:
    def __init__(self, cluster: ProcessCluster, seed: int, log: Callable[[str], None]) -> None:
        self.cluster = cluster
        self.seed = seed
        self.log = log
        self.pool = Pool()
        self.report = Report(seed)
        self._client_channels: list[grpc.Channel] = []
        self._views: dict[int, PeerView] = {}
        ids = sorted(cluster.members)
        members = [cluster.members[i] for i in ids]
        self._ids = ids
        self.targets: list[Target] = []
        for rpc in public_rpcs():
            for authenticated in (False, True):
                self.targets.append(
                    PublicTarget(
                        rpc,
                        authenticated,
                        self.pool,
                        TOKEN,
                        lambda: self._client_channels,
                        frozenset(ids),
                    )
                )
        peer_cluster = PeerCluster(
            peer_addresses=[m.peer_address for m in members],
            member_ids=ids,
            data_dirs=[m.data_dir for m in members],
            secret=cluster.secret_path.read_bytes().strip(),
            view=lambda index: self._views[index],
        )
        for rpc in peer_rpcs():
            for insider in (False, True):
                self.targets.append(PeerTarget(rpc, insider, peer_cluster))
        for target in self.targets:
            self.report.figures[(target.mode, target.name)] = Figures()

    @contextlib.contextmanager
    def channels(self) -> Iterator[None]:
        members = [self.cluster.members[i] for i in self._ids]
        self._client_channels = [grpc.insecure_channel(m.client_address) for m in members]
        try:
            yield
        finally:
            for channel in self._client_channels:
                channel.close()

    # ---------------------------------------------------------------- warm-up

    def warm_up(self) -> None:
        """Make live state to name: a session, a lease, keys, an active round, a store key,
        a checkpoint; every answer goes to the pool."""
        metadata = self.cluster.metadata
        leader = self.cluster.leader(timeout_s=30)
        channel = self._client_channels[self._ids.index(leader)]
        sessions = session_pb2_grpc.SessionStub(channel)
        session = sessions.Open(
            session_pb2.SessionOpenRequest(ttl_ms=600_000), timeout=10, metadata=metadata
        )
        self.pool.harvest(session)
        self.pool.live_session = session.session_id

        def header() -> common_pb2.RequestHeader:
            # The pool's counter: the fuzzer's own requests on this session come after.
            sequence = self.pool.next_sequence()
            return common_pb2.RequestHeader(session_id=session.session_id, sequence=sequence)

        lease = lease_pb2_grpc.LeaseStub(channel).Grant(
            lease_pb2.LeaseGrantRequest(header=header(), ttl_ms=600_000),
            timeout=10,
            metadata=metadata,
        )
        self.pool.harvest(lease)
        kv = kv_pb2_grpc.KVStub(channel)
        for key in (b"fuzz/a", b"fuzz/b", b"counter"):
            self.pool.harvest(
                kv.Put(
                    kv_pb2.PutRequest(header=header(), key=key, value=b"1", lease_id=0),
                    timeout=10,
                    metadata=metadata,
                )
            )
        rendezvous = rendezvous_pb2_grpc.RendezvousStub(channel)
        config = rendezvous_pb2.JobConfig(
            min_nodes=1,
            max_nodes=2,
            last_call_ms=0,
            join_timeout_ms=60_000,
            heartbeat_interval_ms=60_000,
            phi_threshold=8.0,
            phi_window=10,
            min_std_ms=100,
            acceptable_pause_ms=600_000,
            keep_checkpoints=2,
        )
        joined = rendezvous.Join(
            rendezvous_pb2.JoinRequest(header=header(), job="job-a", name="w0", config=config),
            timeout=10,
            metadata=metadata,
        )
        self.pool.harvest(joined)

        def active() -> rendezvous_pb2.GetJobResponse | None:
            job = rendezvous.GetJob(
                rendezvous_pb2.GetJobRequest(job="job-a"), timeout=5, metadata=metadata
            )
            return job if job.round.state == rendezvous_pb2.ROUND_STATE_ACTIVE else None

        job = wait_until(active, 20, "the warm-up round to close")
        self.pool.harvest(job)
        scope = rendezvous_pb2.StoreScope(
            job="job-a", round=job.round.round, participant_id=joined.participant_id
        )
        rendezvous_pb2_grpc.RoundStoreStub(channel).Set(
            rendezvous_pb2.StoreSetRequest(header=header(), scope=scope, key=b"k", value=b"1"),
            timeout=10,
            metadata=metadata,
        )
        fence = rendezvous_pb2.CheckpointFence(
            job="job-a", round=job.round.round, fencing_token=job.round.fencing_token
        )
        begun = rendezvous_pb2_grpc.CheckpointRegistryStub(channel).Begin(
            rendezvous_pb2.CheckpointBeginRequest(
                header=header(), fence=fence, step=1, world_size=1, uri="file:///tmp/ckpt"
            ),
            timeout=10,
            metadata=metadata,
        )
        self.pool.harvest(begun)

    # ---------------------------------------------------------------- fuzzing

    def _keep_a_live_session(self) -> None:
        """Open a session for plausible requests to name when the last one is gone (the
        fuzz closes sessions, and lets the short-lived ones it opens expire)."""
        metadata = self.cluster.metadata
        stubs = [session_pb2_grpc.SessionStub(channel) for channel in self._client_channels]
        try:
            if self.pool.live_session:
                stubs[0].KeepAlive(
                    session_pb2.SessionKeepAliveRequest(session_id=self.pool.live_session),
                    timeout=5,
                    metadata=metadata,
                )
                return
        except grpc.RpcError as error:
            if error.code() is not grpc.StatusCode.NOT_FOUND:
                return  # an election, say: try again before the next batch
        try:
            opened = stubs[0].Open(
                session_pb2.SessionOpenRequest(ttl_ms=600_000), timeout=5, metadata=metadata
            )
        except grpc.RpcError:
            return
        self.pool.live_session = opened.session_id

    def _refresh_views(self) -> None:
        statuses = {i: self.cluster.status(i, timeout_s=2.0) for i in self._ids}
        leader = next((s.leader_id for s in statuses.values() if s and s.leader_id), self._ids[0])
        for index, member_id in enumerate(self._ids):
            status = statuses[member_id]
            sender = leader if leader != member_id else next(i for i in self._ids if i != member_id)
            others = tuple(i for i in self._ids if i not in (member_id, sender))
            self._views[index] = PeerView(
                receiver=member_id,
                sender=sender,
                others=others,
                term=int(status.term) if status else 1,
                last_index=int(status.commit_index) if status else 1,
            )

    def _run_batch(self, target: Target, batch_seed: int, examples: int, stop_at: float) -> None:
        figures = self.report.figures[(target.mode, target.name)]
        if target.mode == "client":
            self._keep_a_live_session()
        else:
            self._refresh_views()

        def body(example: Any) -> None:
            if time.monotonic() > stop_at:
                return
            verdict = target.run(example)
            if not verdict.sent:
                figures.skipped += 1
                return
            figures.sent += 1
            figures.outcomes[verdict.outcome] += 1
            if verdict.failure is not None:
                self.report.findings.append(
                    Finding(target.mode, target.name, batch_seed, verdict.failure, verdict.request)
                )

        run_batch(target.strategy(), batch_seed, examples, body)
        self.report.batches += 1

    def fuzz(self, time_s: float) -> None:
        rng = random.Random(self.seed)
        started = time.monotonic()
        # The first pass tries every target, however short the time.
        for target in self.targets:
            self._run_batch(target, rng.getrandbits(64), FIRST_PASS_EXAMPLES, float("inf"))
        self.log(f"first pass: every target tried in {time.monotonic() - started:.1f} s")
        in_mode = Counter[str]()
        for target in self.targets:
            in_mode[target.mode] += target.weight
        weights = [MODE_SHARES[t.mode] * t.weight / in_mode[t.mode] for t in self.targets]
        stop_at = started + time_s
        while time.monotonic() < stop_at:
            target = rng.choices(self.targets, weights=weights)[0]
            self._run_batch(target, rng.getrandbits(64), EXAMPLES_PER_BATCH, stop_at)

    # ---------------------------------------------------------------- checks

    def check(self) -> None:
        """The checks of checks.py; each problem is a finding."""
        cluster = self.cluster
        problems = checks.alive(cluster)
        try:
            if problems:
                raise checks.CheckFailed("; ".join(problems))
            checks.write_and_read(cluster, b"fuzz/check/before", b"before the restart")
            index, keys = checks.agreement(cluster)
            self.report.checks.append(f"members agree at applied index {index} ({keys} keys)")
            restart = checks.restart_all(cluster)
            if restart:
                raise checks.CheckFailed("; ".join(restart))
            self.report.checks.append("every member restarted from its own disk")
            checks.write_and_read(cluster, b"fuzz/check/after", b"after the restart")
            index, keys = checks.agreement(cluster)
            self.report.checks.append(
                f"after the restart: members agree at applied index {index} ({keys} keys)"
            )
            checks.write_and_read(cluster, b"fuzz/check/before", b"before the restart again")
        except (checks.CheckFailed, TimeoutError) as failed:
            self.report.findings.append(Finding("check", "", self.seed, str(failed)))
        for logged in checks.logged_errors(cluster):
            self.report.findings.append(Finding("check", "", self.seed, logged))


def run(time_s: float, seed: int, log: Callable[[str], None], keep: Path | None = None) -> Report:
    """Start a cluster, fuzz it for ``time_s`` seconds (after a first pass over every
    target), check it, stop it; the report."""
    root = Path(tempfile.mkdtemp(prefix="rallypoint-fuzz-")) if keep is None else keep
    cluster = ProcessCluster(root, 3, snapshot_entries=SNAPSHOT_ENTRIES, auth_token=TOKEN)
    fuzzer = Fuzzer(cluster, seed, log)
    try:
        started = time.monotonic()
        cluster.start_all()
        cluster.leader(timeout_s=30)
        log(f"cluster up in {root} ({time.monotonic() - started:.1f} s)")
        with fuzzer.channels():
            fuzzer.warm_up()
            fuzzer.fuzz(time_s)
        started = time.monotonic()
        fuzzer.check()
        log(f"checks done ({time.monotonic() - started:.1f} s)")
    finally:
        cluster.shutdown()
        kill_processes_mentioning(str(root))
        if keep is None and not fuzzer.report.findings:
            shutil.rmtree(root, ignore_errors=True)
        elif fuzzer.report.findings:
            log(f"member data and logs kept in {root}")
    return fuzzer.report
