"""Real network faults between members: one network namespace per member.

Layout. Member N runs in namespace ``rpj-mN`` whose veth ``rpjnN`` has 10.213.0.N/24; its
host end ``rpjhN`` is a port of the bridge ``rpjbr0`` in the root namespace, which has
10.213.0.254. Members listen on their own address (peer port 2380, client port 2379); the
harness and the clients run in the root namespace and reach every member through the bridge.
Nothing routes beyond the bridge: member namespaces have no default route and the bridge's
subnet is only on this machine.

Faults are rules inside the members' namespaces, so they hit the real peer traffic:

- partitions: iptables DROP of everything to and from the chosen peers' addresses (a chain
  ``RPJ`` hooked into INPUT and OUTPUT; healing flushes it). Clients still reach every member,
  as in Jepsen: a minority member keeps answering clients, which is what a stale read needs.
- loss: iptables ``statistic`` random DROP of peer packets.
- delay: ``tc netem`` where the kernel has it; kernels without sch_netem (this CI machine's)
  get a ``tbf`` bottleneck instead, whose queue holds packets up to its latency bound, so
  messages arrive late and bursts are dropped.

Everything is named with the ``rpj`` prefix; :func:`cleanup` removes all of it and runs at
start (leftovers of a crashed run) and at the end, failure or not.

Lanes. Several runs can go at once, one per process, each in its own lane (:func:`set_lane`):
lane K > 0 names everything ``rpjK...`` (namespaces ``rpjK-mN``, veths ``rpjKhN``/``rpjKnN``,
bridge ``rpjbrK``) on subnet 10.213.K.0/24, so lanes never touch each other's namespaces or
rules, and cleaning one lane leaves the others running. Lane 0 is the layout above.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Iterable

CHAIN = "RPJ"
PEER_PORT = 2380
CLIENT_PORT = 2379
MAX_LANES = 200

_lane = 0


def set_lane(lane: int) -> None:
    """Use lane ``lane``'s names and subnet from now on, in this process."""
    global _lane
    if not 0 <= lane < MAX_LANES:
        raise ValueError(f"lanes are 0..{MAX_LANES - 1}, got {lane}")
    _lane = lane


def _tag() -> str:
    return str(_lane) if _lane else ""


def _subnet_prefix() -> str:
    return f"10.213.{_lane}."


def bridge() -> str:
    return f"rpjbr{_lane}"


def host_end(member_id: int) -> str:
    """The root-namespace end of a member's veth (a port of the bridge)."""
    return f"rpj{_tag()}h{member_id}"


def member_end(member_id: int) -> str:
    """The member-namespace end of its veth, which carries the member's address."""
    return f"rpj{_tag()}n{member_id}"


def _run(*command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, check=check, capture_output=True, text=True, timeout=30)


def namespace(member_id: int) -> str:
    return f"rpj{_tag()}-m{member_id}"


def address(member_id: int) -> str:
    if not 1 <= member_id <= 250:
        raise ValueError(f"member ids 1..250 fit the subnet, got {member_id}")
    return _subnet_prefix() + str(member_id)


def _in(member_id: int, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run("ip", "netns", "exec", namespace(member_id), *command, check=check)


def cleanup() -> None:
    """Remove every namespace, veth and the bridge of this lane (idempotent)."""
    prefix = namespace(0)[:-1]
    listed = _run("ip", "netns", "list", check=False).stdout.split("\n")
    for line in listed:
        name = line.split(" ")[0]
        if name.startswith(prefix):
            _run("ip", "netns", "delete", name, check=False)
    links = _run("ip", "-o", "link", "show", check=False).stdout.split("\n")
    for line in links:
        parts = line.split(": ")
        if len(parts) > 1:
            name = parts[1].split("@")[0]
            if name.startswith(host_end(0)[:-1]) or name == bridge():
                _run("ip", "link", "delete", name, check=False)


class Network:
    """The bridge and the members' namespaces, with faults applied to them."""

    def __init__(self) -> None:
        self.members: set[int] = set()
        # Members with a delay qdisc on their veth (removed on heal).
        self._delayed: set[int] = set()
        self._netem: bool | None = None
        # What the faults in effect do, for the availability checker: pairs (smaller id
        # first) that cannot reach each other, and members slowed or made lossy.
        self.blocked: set[tuple[int, int]] = set()
        self.degraded: set[int] = set()
        # Called after every change of the above.
        self.on_change: Callable[[], None] | None = None

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def setup(self) -> None:
        cleanup()
        _run("ip", "link", "add", bridge(), "type", "bridge")
        _run("ip", "addr", "add", _subnet_prefix() + "254/24", "dev", bridge())
        _run("ip", "link", "set", bridge(), "up")

    def add_member(self, member_id: int) -> None:
        ns, host, ns_end = namespace(member_id), host_end(member_id), member_end(member_id)
        _run("ip", "netns", "delete", ns, check=False)
        _run("ip", "link", "delete", host, check=False)
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", host, "type", "veth", "peer", "name", ns_end)
        _run("ip", "link", "set", ns_end, "netns", ns)
        _run("ip", "link", "set", host, "master", bridge())
        _run("ip", "link", "set", host, "up")
        _in(member_id, "ip", "addr", "add", address(member_id) + "/24", "dev", ns_end)
        _in(member_id, "ip", "link", "set", ns_end, "up")
        _in(member_id, "ip", "link", "set", "lo", "up")
        _in(member_id, "iptables", "-N", CHAIN)
        _in(member_id, "iptables", "-I", "INPUT", "-j", CHAIN)
        _in(member_id, "iptables", "-I", "OUTPUT", "-j", CHAIN)
        self.members.add(member_id)

    def teardown(self) -> None:
        cleanup()
        self.members.clear()

    # ------------------------------------------------------------------ faults

    def block(self, pairs: Iterable[tuple[int, int]]) -> None:
        """Drop all traffic between each (a, b), both directions, at both ends."""
        for a, b in pairs:
            for here, there in ((a, b), (b, a)):
                if here in self.members:
                    _in(here, "iptables", "-A", CHAIN, "-s", address(there), "-j", "DROP")
                    _in(here, "iptables", "-A", CHAIN, "-d", address(there), "-j", "DROP")
            self.blocked.add((min(a, b), max(a, b)))
        self._changed()

    def lose(self, member_ids: Iterable[int], probability: float) -> None:
        """Drop this fraction of the packets each member exchanges with the other members."""
        chosen = list(member_ids)
        for member in chosen:
            for other in sorted(self.members - {member}):
                for direction in ("-s", "-d"):
                    _in(
                        member,
                        "iptables",
                        "-A",
                        CHAIN,
                        direction,
                        address(other),
                        "-m",
                        "statistic",
                        "--mode",
                        "random",
                        "--probability",
                        f"{probability:.3f}",
                        "-j",
                        "DROP",
                    )
            self.degraded.add(member)
        self._changed()

    def delay(self, member_ids: Iterable[int], delay_ms: int, jitter_ms: int) -> str:
        """Delay everything each member sends; the mechanism used ("netem" or "tbf")."""
        kind = "netem" if self._has_netem() else "tbf"
        for member in member_ids:
            device = member_end(member)
            if kind == "netem":
                _in(
                    member,
                    *("tc", "qdisc", "replace", "dev", device, "root", "netem"),
                    *("delay", f"{delay_ms}ms", f"{jitter_ms}ms"),
                )
            else:
                # A narrow pipe whose queue may hold a packet up to delay_ms + jitter_ms.
                _in(
                    member,
                    *("tc", "qdisc", "replace", "dev", device, "root", "tbf"),
                    *("rate", "96kbit", "burst", "3000", "latency", f"{delay_ms + jitter_ms}ms"),
                )
            self._delayed.add(member)
            self.degraded.add(member)
        self._changed()
        return kind

    def _has_netem(self) -> bool:
        if self._netem is None:
            probe = sorted(self.members)[0]
            result = _in(
                probe,
                "tc",
                "qdisc",
                "add",
                "dev",
                "lo",
                "root",
                "netem",
                "delay",
                "1ms",
                check=False,
            )
            self._netem = result.returncode == 0
            if self._netem:
                _in(probe, "tc", "qdisc", "del", "dev", "lo", "root", check=False)
        return self._netem

    def heal(self) -> None:
        """Remove every partition, loss and delay rule."""
        for member in sorted(self.members):
            with contextlib.suppress(subprocess.CalledProcessError):
                _in(member, "iptables", "-F", CHAIN)
        for member in sorted(self._delayed):
            _in(member, "tc", "qdisc", "del", "dev", member_end(member), "root", check=False)
        self._delayed.clear()
        self.blocked.clear()
        self.degraded.clear()
        self._changed()

    def forget(self, member_id: int) -> None:
        """A removed member's namespace goes (its process must be gone)."""
        _run("ip", "netns", "delete", namespace(member_id), check=False)
        _run("ip", "link", "delete", host_end(member_id), check=False)
        self.members.discard(member_id)
        self._delayed.discard(member_id)
        self.degraded.discard(member_id)
        self.blocked = {p for p in self.blocked if member_id not in p}
        self._changed()
