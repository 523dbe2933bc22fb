"""Checkers: each turns a run's operations into a verdict and, when it fails, the smallest
stretch of history that shows the anomaly.

- register: linearizability (wgl.py) per key, unknown outcomes possibly applied.
- set: every acknowledged add is in the final read; nothing read that nobody added.
- lease: fencing tokens of grants strictly increase in real time; the accepted fenced writes,
  in revision order, never go back to a smaller token (no stale token accepted).
- watch: every watcher delivered the same revisions in the same order, strictly increasing,
  and none missed an acknowledged write within the range it covered.
- rendezvous: every participant of one round number saw the same members and ranks.
- members: no member exited on its own (a crash, or a broken invariant stopping it: exit 70);
  the nemesis's kills and a member refusing a log it found corrupt do not count.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .history import Operation
from .models import RegisterModel
from .wgl import Verdict, check_history, smallest_window


class Outcome(enum.Enum):
    VALID = "valid"
    INVALID = "invalid"
    UNKNOWN = "unknown"


@dataclass
class CheckResult:
    checker: str
    outcome: Outcome
    summary: str
    # The operations that show the anomaly (empty when valid).
    anomaly: list[Operation] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)


def describe(op: Operation, origin_s: float = 0.0) -> str:
    end = "    ?   " if op.unknown else f"{op.return_s - origin_s:8.3f}"
    result = "unknown" if op.unknown else repr(op.output)
    return (
        f"[{op.call_s - origin_s:8.3f} .. {end}] p{op.process:<3} {op.f:<6} "
        f"{op.key:<10} {op.input!r} -> {result}"
    )


def check_register(
    ops: Sequence[Operation], budget_s: float, name: str = "register"
) -> CheckResult:
    """Linearizability of every key's reads, writes and compare-and-sets (``name``: the
    checker's name in the report: "register" for the KV registers, "store" for the round
    store's, read through the bridge's cache leases)."""
    model = RegisterModel()
    result = check_history(model, ops, budget_s)
    stats = {
        "operations": len(ops),
        "keys": len(result.keys),
        "unknown_outcomes": sum(op.unknown for op in ops),
        "keys_unknown": sum(k.verdict is Verdict.UNKNOWN for k in result.keys),
    }
    if not any(op.status == "ok" for op in ops):
        return CheckResult(name, Outcome.UNKNOWN, "no operation completed", stats=stats)
    if result.verdict is Verdict.LINEARIZABLE:
        return CheckResult(name, Outcome.VALID, "linearizable", stats=stats)
    if result.verdict is Verdict.UNKNOWN:
        return CheckResult(
            name, Outcome.UNKNOWN, "search budget ran out before a verdict", stats=stats
        )
    failing = result.failures[0]
    key_ops = [op for op in ops if op.key == failing.key]
    window = smallest_window(model, key_ops, budget_s=min(30.0, budget_s))
    # The window's later writes are kept as unknown outcomes for soundness; the reader is
    # shown the operations as they happened, and told how many follow.
    as_recorded = {op.op_id: op for op in key_ops}
    shown = [op for op in window if op == as_recorded[op.op_id]]
    stats["window_operations"] = len(shown)
    return CheckResult(
        name,
        Outcome.INVALID,
        f"key {failing.key} is not linearizable ({len(result.failures)} key(s) fail); "
        f"{failing.longest_prefix} of {failing.operations} operations linearized at most; "
        f"shortest failing window: {len(shown)} operations, with {len(window) - len(shown)} "
        "later writes taken as unknown",
        shown,
        stats,
    )


def check_set(ops: Sequence[Operation]) -> CheckResult:
    adds = [op for op in ops if op.f == "add"]
    reads = [op for op in ops if op.f == "read" and not op.unknown]
    stats: dict[str, Any] = {"adds": len(adds), "acknowledged": sum(not a.unknown for a in adds)}
    if not reads:
        return CheckResult("set", Outcome.UNKNOWN, "no final read succeeded", stats=stats)
    final = max(reads, key=lambda op: op.call_s)
    seen = set(final.output)
    attempted = {a.input for a in adds}
    lost = [a for a in adds if not a.unknown and a.input not in seen]
    unexpected = sorted(seen - attempted)
    stats.update(
        read=len(seen),
        lost=len(lost),
        unexpected=len(unexpected),
        unknown_present=sum(a.unknown and a.input in seen for a in adds),
    )
    if lost or unexpected:
        return CheckResult(
            "set",
            Outcome.INVALID,
            f"{len(lost)} acknowledged add(s) lost, {len(unexpected)} element(s) never added "
            f"were read (first unexpected: {unexpected[:5]})",
            [*lost[:10], final],
            stats,
        )
    return CheckResult("set", Outcome.VALID, "no acknowledged add lost", stats=stats)


def check_lease(ops: Sequence[Operation]) -> CheckResult:
    """Grants: output {"lease_id", "token"}. Fenced writes: input {"token", ...}, output
    {"revision"}."""
    grants = [op for op in ops if op.f == "grant" and not op.unknown]
    writes = [op for op in ops if op.f == "write" and not op.unknown]
    stats = {"grants": len(grants), "accepted_writes": len(writes)}
    if not grants:
        return CheckResult("lease", Outcome.UNKNOWN, "no lease was granted", stats=stats)
    # Tokens strictly increase in real time: a grant called after another returned has a
    # larger token.
    by_return = sorted(grants, key=lambda op: op.return_s)
    best: Operation | None = None
    position = 0
    for grant in sorted(grants, key=lambda op: op.call_s):
        while position < len(by_return) and by_return[position].return_s < grant.call_s:
            earlier = by_return[position]
            if best is None or earlier.output["token"] > best.output["token"]:
                best = earlier
            position += 1
        if best is not None and grant.output["token"] <= best.output["token"]:
            return CheckResult(
                "lease",
                Outcome.INVALID,
                f"token {grant.output['token']} granted after token {best.output['token']} "
                "had been granted: tokens must strictly increase",
                [best, grant],
                stats,
            )
    tokens = [g.output["token"] for g in grants]
    if len(set(tokens)) != len(tokens):
        return CheckResult("lease", Outcome.INVALID, "two grants share a token", [], stats)
    # Accepted writes in the store's order never step back to an older token.
    by_key: dict[str, list[Operation]] = {}
    for write in writes:
        by_key.setdefault(write.key, []).append(write)
    for key, key_writes in sorted(by_key.items()):
        key_writes.sort(key=lambda op: op.output["revision"])
        highest: Operation | None = None
        for write in key_writes:
            if highest is not None and write.input["token"] < highest.input["token"]:
                return CheckResult(
                    "lease",
                    Outcome.INVALID,
                    f"key {key}: a write with stale token {write.input['token']} was accepted "
                    f"at revision {write.output['revision']}, after token "
                    f"{highest.input['token']} wrote at revision {highest.output['revision']}",
                    [highest, write],
                    stats,
                )
            if highest is None or write.input["token"] > highest.input["token"]:
                highest = write
    return CheckResult(
        "lease", Outcome.VALID, "tokens increase; no stale token accepted", stats=stats
    )


def check_watch(ops: Sequence[Operation]) -> CheckResult:
    """Deliveries: f "event", process = watcher, output [revision, key, value]. Writes: f
    "put", output {"revision"}."""
    streams: dict[int, list[Operation]] = {}
    for op in ops:
        if op.f == "event" and not op.unknown:
            streams.setdefault(op.process, []).append(op)
    acknowledged = sorted(op.output["revision"] for op in ops if op.f == "put" and not op.unknown)
    stats = {"watchers": len(streams), "acknowledged_writes": len(acknowledged)}
    if not streams:
        return CheckResult("watch", Outcome.UNKNOWN, "no watcher delivered anything", stats=stats)
    longest = max(streams.values(), key=len)
    reference = [tuple(op.output) for op in longest]
    stats["delivered_max"] = len(reference)
    for process, deliveries in sorted(streams.items()):
        revisions = [op.output[0] for op in deliveries]
        for i in range(1, len(revisions)):
            if revisions[i] <= revisions[i - 1]:
                what = "duplicate" if revisions[i] == revisions[i - 1] else "out of order"
                return CheckResult(
                    "watch",
                    Outcome.INVALID,
                    f"watcher p{process}: revision {revisions[i]} {what} after {revisions[i - 1]}",
                    deliveries[max(0, i - 3) : i + 1],
                    stats,
                )
        seen = [tuple(op.output) for op in deliveries]
        if seen != reference[: len(seen)]:
            index = next(i for i, (a, b) in enumerate(zip(seen, reference, strict=False)) if a != b)
            return CheckResult(
                "watch",
                Outcome.INVALID,
                f"watcher p{process} delivered {seen[index]} where another delivered "
                f"{reference[index]} (position {index})",
                [deliveries[index], longest[index]],
                stats,
            )
        covered = set(revisions)
        last = revisions[-1] if revisions else 0
        missed = [r for r in acknowledged if r <= last and r not in covered]
        if missed:
            return CheckResult(
                "watch",
                Outcome.INVALID,
                f"watcher p{process} skipped acknowledged revision(s) {missed[:5]} "
                f"(it reached {last})",
                deliveries[-3:],
                stats,
            )
    return CheckResult(
        "watch", Outcome.VALID, "same ordered revisions everywhere, no gap", stats=stats
    )


def check_rendezvous(ops: Sequence[Operation]) -> CheckResult:
    """Round views: f "round", output {"round": n, "members": {name: rank}}."""
    views: dict[int, Operation] = {}
    count = 0
    for op in ops:
        if op.f != "round" or op.unknown:
            continue
        count += 1
        number = op.output["round"]
        first = views.setdefault(number, op)
        if first.output["members"] != op.output["members"]:
            return CheckResult(
                "rendezvous",
                Outcome.INVALID,
                f"round {number}: p{first.process} saw {first.output['members']}, "
                f"p{op.process} saw {op.output['members']}",
                [first, op],
                {"views": count, "rounds": len(views)},
            )
    stats = {"views": count, "rounds": len(views)}
    if not views:
        return CheckResult("rendezvous", Outcome.UNKNOWN, "no round was seen", stats=stats)
    return CheckResult(
        "rendezvous", Outcome.VALID, "one membership and ranking per round", stats=stats
    )


def check_members(exited_on_their_own: dict[int, int]) -> CheckResult:
    stats: dict[str, Any] = {"exited": len(exited_on_their_own)}
    if not exited_on_their_own:
        return CheckResult("members", Outcome.VALID, "no member exited on its own", stats=stats)
    listed = ", ".join(f"{m} (code {c})" for m, c in sorted(exited_on_their_own.items()))
    return CheckResult(
        "members", Outcome.INVALID, f"members exited on their own: {listed}", stats=stats
    )
