"""The cluster version (coordinator/version.py): what needs which record version, the
proposal (the minimum over voters and learners, through Raft), the gate at the proposal
point, the snapshot format that follows it, and a member older than it refusing to start."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

from rallypoint.coordinator import version as version_module
from rallypoint.coordinator.leader.versions import VersionProbe
from rallypoint.coordinator.node import driver as node_driver
from rallypoint.coordinator.node.api import NodeStartError
from rallypoint.coordinator.state import codec
from rallypoint.coordinator.state.commands import (
    ClusterVersion,
    Envelope,
    LeaseGrant,
    Put,
    encode_envelope,
)
from rallypoint.coordinator.state.machine import StateMachine
from rallypoint.coordinator.state.results import (
    ClusterVersionResult,
    LeaseGrantResult,
    PutResult,
)
from rallypoint.coordinator.state.versions import INTRODUCED, required_version
from rallypoint.coordinator.version import (
    BASELINE_RECORD_VERSION,
    RECORD_VERSION,
    VERSIONS,
    ClusterVersionError,
    cluster_version_to_propose,
    startup_refusal,
)

from .test_node import Cluster, open_session, stored_cluster_version, wait_until

BASELINE_RECORDS = Path(__file__).parents[1] / "upgrade" / "baseline_records.json"


# ------------------------------------------------------------------ what needs which version


def test_every_record_format_is_in_the_baseline_or_says_which_version_introduced_it() -> None:
    baseline = {
        (entry["type"], int(version))
        for entry in json.loads(BASELINE_RECORDS.read_text()).values()
        for version in entry["versions"]
    }
    for tag, fmt in codec.record_formats().items():
        if not codec.record_class(tag).__module__.startswith("rallypoint."):
            continue  # a record another test registers
        for version in range(1, fmt.version + 1):
            pair = (fmt.name, version)
            assert pair in baseline or pair in INTRODUCED, (
                f"{fmt.name} format {version} is not in the baseline (commit 21ef0cc): add it "
                "to state/versions.py INTRODUCED with the record version that brings it"
            )
            assert pair not in baseline or pair not in INTRODUCED, f"{pair} is in both"
    assert set(INTRODUCED.values()) <= set(VERSIONS)
    assert max(VERSIONS) == RECORD_VERSION and min(VERSIONS) == BASELINE_RECORD_VERSION


def test_a_command_needs_the_version_of_the_format_it_is_written_in() -> None:
    # A put that keeps no lease is written in format 1, which the baseline reads.
    assert required_version(Put(b"k", b"v")) == (BASELINE_RECORD_VERSION, "")
    assert required_version(Put(b"k", b"v", keep_lease=True)) == (2, "Put.keep_lease")
    assert required_version(ClusterVersion(2)) == (2, "the ClusterVersion record")
    inside = Envelope(1, 1, 0, 0, Put(b"k", b"v", keep_lease=True))
    assert required_version(inside) == (2, "Put.keep_lease")


def test_the_cluster_version_to_propose_is_the_minimum_over_voters_and_learners() -> None:
    members = frozenset({1, 2, 3, 4})  # 4 a learner: it counts as much as a voter
    assert cluster_version_to_propose({1: 3, 2: 2, 3: 3, 4: 3}, members) == 2
    assert cluster_version_to_propose({1: 3, 2: 3, 3: 3, 4: 2}, members) == 2
    # A member not heard from: unknown, so nothing is proposed.
    assert cluster_version_to_propose({1: 3, 2: 3, 3: 3}, members) is None
    # A member of the baseline could not decode the command: nothing is proposed.
    assert cluster_version_to_propose({1: 2, 2: 2, 3: 2, 4: 1}, members) is None
    # Answers of members outside the configuration do not count.
    assert cluster_version_to_propose({1: 2, 2: 2, 3: 2, 4: 2, 9: 1}, members) == 2


def test_a_member_older_than_the_cluster_version_is_refused_in_one_line() -> None:
    assert startup_refusal(RECORD_VERSION) is None
    assert startup_refusal(BASELINE_RECORD_VERSION) is None
    line = startup_refusal(3, own=2)
    assert line is not None and "\n" not in line
    assert "cluster version is 3" in line and "up to 2" in line


# ------------------------------------------------------------------ the state machine


def apply(machine: StateMachine, index: int, command: object) -> object:
    return machine.apply(index, encode_envelope(Envelope(0, 0, 0, index, command)))  # type: ignore[arg-type]


def test_the_cluster_version_never_goes_down_and_travels_in_the_snapshot() -> None:
    machine = StateMachine()
    assert machine.cluster_version == BASELINE_RECORD_VERSION
    before = machine.snapshot()
    # Below cluster version 2 the snapshot is in the format the baseline reads.
    assert msgpack.unpackb(before)[0] <= 7
    assert apply(machine, 1, ClusterVersion(2)) == ClusterVersionResult(2, True)
    assert apply(machine, 2, ClusterVersion(1)) == ClusterVersionResult(2, False)
    assert machine.cluster_version == 2
    data = machine.snapshot()
    assert msgpack.unpackb(data)[0] == 8
    restored = StateMachine()
    restored.restore(data)
    assert restored.cluster_version == 2 and restored.snapshot() == data


def test_keep_lease_keeps_the_keys_lease() -> None:
    machine = StateMachine()
    session = machine.apply(1, encode_envelope(Envelope(0, 0, 0, 1, _session_open())))
    session_id = session.session_id  # type: ignore[attr-defined]
    grant = machine.apply(2, encode_envelope(Envelope(session_id, 1, 0, 2, LeaseGrant(60_000))))
    assert isinstance(grant, LeaseGrantResult)
    put = Put(b"k", b"v1", lease_id=grant.lease_id)
    machine.apply(3, encode_envelope(Envelope(session_id, 2, 0, 3, put)))
    kept = Put(b"k", b"v2", keep_lease=True)
    result = machine.apply(4, encode_envelope(Envelope(session_id, 3, 0, 4, kept)))
    assert isinstance(result, PutResult) and result.kv.lease_id == grant.lease_id
    fresh = Put(b"new", b"v", keep_lease=True)
    result = machine.apply(5, encode_envelope(Envelope(session_id, 4, 0, 5, fresh)))
    assert isinstance(result, PutResult) and result.kv.lease_id == 0


def _session_open() -> object:
    from rallypoint.coordinator.state.commands import SessionOpen

    return SessionOpen(60_000)


# ------------------------------------------------------------------ members in one process


async def test_the_leader_raises_the_cluster_version_once_every_member_advertises_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The other members answer the leader's hello as members of the baseline would (no
    # version) until they are "upgraded": the cluster stays at the baseline, and a feature
    # of version 2 is refused at the proposal point, naming the version it needs.
    upgraded = False
    real_asker = node_driver.version_asker

    def asker(*args: Any) -> Callable[[int, str], Awaitable[int | None]]:
        real_ask = real_asker(*args)

        async def ask(member_id: int, address: str) -> int | None:
            answered = await real_ask(member_id, address)
            if not upgraded and answered is not None:
                return BASELINE_RECORD_VERSION
            return answered

        return ask

    monkeypatch.setattr(node_driver, "version_asker", asker)
    cluster = Cluster(tmp_path, 3)
    await cluster.start_all()
    try:
        leader = await cluster.leader()
        session = await open_session(leader)
        await wait_until(lambda: len(leader.versions.advertised) == 3, "every member heard")
        others = set(cluster.nodes) - {leader.member_id}
        assert {leader.versions.advertised[m] for m in others} == {BASELINE_RECORD_VERSION}
        assert all(n.state.cluster_version == 1 for n in cluster.nodes.values())
        with pytest.raises(ClusterVersionError) as refused:
            await leader.propose(Put(b"k", b"v", keep_lease=True), session_id=session, sequence=1)
        assert str(refused.value) == (
            "Put.keep_lease needs cluster version 2; the cluster is at version 1 (some "
            "member runs an older release): upgrade every member first"
        )
        # Nothing above the cluster version was encoded: a put without the feature goes.
        plain = await leader.propose(Put(b"k", b"v"), session_id=session, sequence=1)
        assert isinstance(plain, PutResult)
        upgraded = True
        await wait_until(
            lambda: all(n.state.cluster_version == RECORD_VERSION for n in cluster.nodes.values()),
            "the cluster version raised on every member",
        )
        kept = await leader.propose(
            Put(b"k", b"v2", keep_lease=True), session_id=session, sequence=2
        )
        assert isinstance(kept, PutResult)
        assert all(n.status().cluster_version == RECORD_VERSION for n in cluster.nodes.values())
    finally:
        for member_id in list(cluster.nodes):
            await cluster.stop(member_id)
    assert not cluster.fatal


async def test_a_member_older_than_the_persisted_cluster_version_refuses_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = Cluster(tmp_path, 3)
    await cluster.start_all()
    try:
        await cluster.leader()
        await wait_until(
            lambda: all(n.state.cluster_version == RECORD_VERSION for n in cluster.nodes.values()),
            "the cluster version raised",
        )
        node = cluster.nodes[3]
        # The raise is stored in a snapshot at once (so an older build reads it first). Not
        # "any snapshot": the bootstrap one at index 1 predates the raise, and a member
        # stopped before the raise's snapshot was written opens without it.
        await wait_until(
            lambda: stored_cluster_version(node) == RECORD_VERSION, "the snapshot of the raise"
        )
        await cluster.stop(3)
        # The same data directory opened by a build one record version older.
        monkeypatch.setattr(version_module, "RECORD_VERSION", RECORD_VERSION - 1)
        with pytest.raises(NodeStartError) as refused:
            await cluster.start(3)
        message = str(refused.value)
        assert "\n" not in message
        assert message.startswith(f"member 3: the cluster version is {RECORD_VERSION}, ")
        assert f"up to {RECORD_VERSION - 1}" in message
    finally:
        for member_id in list(cluster.nodes):
            await cluster.stop(member_id)


async def test_the_leaders_probe_proposes_the_minimum_once_and_never_past_an_unheard_member() -> (
    None
):
    answers: dict[int, int | None] = {2: 2, 3: None, 4: 2}  # 4 a learner; 3 does not answer
    proposed: list[int] = []
    current = [1]

    async def ask(member_id: int, address: str) -> int | None:
        assert address == f"peer-{member_id}"
        return answers[member_id]

    async def propose(version: int) -> None:
        proposed.append(version)
        current[0] = version

    probe = VersionProbe(
        1,
        ask,
        lambda: {m: f"peer-{m}" for m in (1, 2, 3, 4)},
        lambda: current[0],
        propose,
    )
    assert await probe.probe_once() is None  # not the leader: nothing
    probe.promote()
    assert await probe.probe_once() is None and proposed == []  # member 3 unheard
    answers[3] = 1
    assert await probe.probe_once() is None and proposed == []  # member 3 is the baseline
    answers[3] = 2
    assert await probe.probe_once() == 2 and proposed == [2]
    assert await probe.probe_once() is None and proposed == [2]  # never proposed twice
    probe.demote()
    assert probe.advertised == {}
