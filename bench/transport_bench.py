"""What one message costs through gRPC's Python machinery, against a plain TCP connection.

A put through rallypoint crosses gRPC nine times: the client's unary ``KV.Put`` to the leader
and its answer, and eight peer-stream messages (an append to each follower, each follower's
acknowledgement, the commit index to each follower and each follower's acknowledgement). This
benchmark measures those legs alone, with no Raft, no disk and no handler work, so the
figures are the floor any design on this transport stands on:

- ``grpc_unary``: one client making back-to-back empty unary calls (a 300-byte request, a
  2-byte answer) to a ``grpc.aio`` server, as a client's put reaches the leader.
- ``grpc_stream``: two processes, each holding a client stream to the other (as the peer
  transport does: ``Raft/Send``, one long-lived stream per direction); a 400-byte message
  goes one way and the answer comes back on the other stream.
- ``tcp_stream``: the same ping-pong over two plain TCP connections on uvloop with a
  4-byte length prefix per message: what a message costs without gRPC.
- ``peer_stream``: the same ping-pong through rallypoint's peer transport, end to end: a
  MsgApp carrying one 400-byte entry, sent by the member's sender (encoded, batched, stamped
  under the session's MAC) and taken by its receiver (checked, decoded, handed to a stand-in
  for Raft that answers at once) over the stream peer protocol (``coordinator/peerwire/``).
  Its figures above ``tcp_stream``'s are rallypoint's own work per message. (Until the
  peers left gRPC there was a ``peer_grpc`` probe beside it: 1.4-1.7x its CPU per message.)

Every probe runs in fresh processes (both ends on uvloop, on the same machine as each other
and as nothing else of this benchmark); the processes count their own CPU (all threads, from
``getrusage``) over the measured messages only. Trials alternate the probes, medians reported.

Output (``--out``, default ``bench/results/transport.json``): ``machine``, ``versions``,
``placement``, ``parameters``, ``results.<probe>`` with ``p50_us``, ``p99_us`` (one round
trip: a call and its answer, or a message and its answer), ``cpu_per_message_us`` (the CPU
both ends spent per message sent and received, over all threads) and, for ``grpc_unary``,
``client_cpu_per_call_us`` and ``server_cpu_per_call_us``, each with its ``trials``; and
``ratios`` {``stream_cpu``, ``stream_p50``}: grpc_stream / tcp_stream, and
{``peer_cpu``, ``peer_p50``}: peer_stream / tcp_stream (rallypoint's own cost per message).
The plot (``transport.png``) shows the round trips and the CPU per message. The last line of
stdout is ``transport: grpc_stream/tcp_stream cpu <x>x p50 <y>x; grpc_unary p50 <z> us;
peer_stream/tcp_stream cpu <u>x p50 <v>x``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import multiprocessing.connection
import os
import resource
import statistics
import struct
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import machine_info, package_versions, percentile, write_results

PROBES = ("grpc_unary", "grpc_stream", "tcp_stream", "peer_stream")
REQUEST = bytes(300)
ANSWER = b"ok"
MESSAGE = bytes(400)
# Messages before the measured ones: connections made, code paths warm.
WARM_UP = 300
# How long a probe's processes may take before the run gives up on them.
PROBE_LIMIT_S = 300.0
_FRAME = struct.Struct(">I")
_SERVICE = "rallypoint.bench.Transport"


def _cpu_s() -> float:
    """CPU seconds this process (every thread) has used, to the microsecond."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- the processes (each starts with spawn: no gRPC state crosses a fork) -------------------


def _identity(data: bytes) -> bytes:
    return data


async def _grpc_server(on_message: Callable[[bytes], Any], unary: bool) -> tuple[Any, int]:
    import grpc
    import grpc.aio

    server = grpc.aio.server()
    if unary:

        async def call(request: bytes, context: Any) -> bytes:
            on_message(request)
            return ANSWER

        handler = grpc.unary_unary_rpc_method_handler(
            call, request_deserializer=_identity, response_serializer=_identity
        )
    else:

        async def send(requests: Any, context: Any) -> bytes:
            async for message in requests:
                on_message(message)
            return ANSWER

        handler = grpc.stream_unary_rpc_method_handler(
            send, request_deserializer=_identity, response_serializer=_identity
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(_SERVICE, {"Call": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


class _Framed(asyncio.Protocol):
    """Length-prefixed messages on a TCP connection, each handed to ``on_message``."""

    def __init__(self, on_message: Callable[[bytes], Any]) -> None:
        self._on_message = on_message
        self._buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        while len(buffer) >= _FRAME.size:
            (size,) = _FRAME.unpack_from(buffer)
            if len(buffer) < _FRAME.size + size:
                return
            message = bytes(buffer[_FRAME.size : _FRAME.size + size])
            del buffer[: _FRAME.size + size]
            self._on_message(message)


class _Counter:
    """Counts the messages an end receives and notes its CPU when the measured ones start
    and end (a responder cannot know otherwise when they do)."""

    def __init__(self, measured: int) -> None:
        self.measured = measured
        self.received = 0
        self.cpu_start_s = 0.0
        self.cpu_end_s = 0.0
        self.done = asyncio.Event()

    def note(self) -> None:
        self.received += 1
        if self.received == WARM_UP:
            self.cpu_start_s = _cpu_s()
        elif self.received == WARM_UP + self.measured:
            self.cpu_end_s = _cpu_s()
            self.done.set()


async def _stream_end(
    kind: str, initiator: bool, measured: int, pipe: multiprocessing.connection.Connection
) -> None:
    """One end of a stream probe: serve, learn the other end's port, connect, then either
    send and time each round trip (the initiator) or answer each message (the responder)."""
    counter = _Counter(measured)
    inbox: asyncio.Queue[bytes] = asyncio.Queue()

    def on_message(message: bytes) -> None:
        counter.note()
        inbox.put_nowait(message)

    loop = asyncio.get_running_loop()
    send: Callable[[bytes], Any]
    closing: Callable[[], Any] | None = None
    if kind == "peer":
        send, closing = await _peer_end(initiator, on_message, pipe)
    elif kind == "grpc":
        import grpc.aio

        server, port = await _grpc_server(on_message, unary=False)
        pipe.send(port)
        other = pipe.recv()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{other}")
        await channel.channel_ready()
        # No request iterator: messages go through call.write, as the peer transport's do.
        call = channel.stream_unary(
            f"/{_SERVICE}/Call", request_serializer=_identity, response_deserializer=_identity
        )()  # type: ignore[call-arg]

        async def send(message: bytes) -> None:
            await call.write(message)

    else:
        tcp_server = await loop.create_server(lambda: _Framed(on_message), "127.0.0.1", 0)
        pipe.send(tcp_server.sockets[0].getsockname()[1])
        other = pipe.recv()
        transport, _ = await loop.create_connection(lambda: _Framed(on_message), "127.0.0.1", other)
        frame_header = _FRAME.pack(len(MESSAGE))

        async def send(message: bytes) -> None:
            transport.write(frame_header + message)

    pipe.send("connected")
    # A peer probe's member must keep serving while it waits (keepalives, the last answer
    # still queued in its sender): it waits off the event loop.
    peer = kind == "peer"

    async def wait_for_parent() -> Any:
        return await loop.run_in_executor(None, pipe.recv) if peer else pipe.recv()

    await wait_for_parent()  # both ends are connected
    latencies: list[float] = []
    if initiator:
        cpu_start = 0.0
        for number in range(WARM_UP + measured):
            if number == WARM_UP:
                cpu_start = _cpu_s()
            started = time.perf_counter()
            await send(MESSAGE)
            await inbox.get()
            if number >= WARM_UP:
                latencies.append(time.perf_counter() - started)
        cpu_used = _cpu_s() - cpu_start
    else:
        for _ in range(WARM_UP + measured):
            await inbox.get()
            await send(MESSAGE)
        cpu_used = counter.cpu_end_s - counter.cpu_start_s
    pipe.send({"latencies_s": latencies, "cpu_s": cpu_used})
    await wait_for_parent()  # the other end has finished too: now connections may close
    if closing is not None:
        await closing()
    elif kind == "grpc":
        call.cancel()
        await channel.close(None)
        await server.stop(0)
    else:
        transport.close()
        tcp_server.close()


class _BenchMember:
    """A stand-in member for the peer probes: both ends of the peer port's host protocols,
    handing every message delivered to ``on_message`` and checking nothing of its own."""

    def __init__(self, member_id: int, on_message: Callable[[bytes], Any]) -> None:
        from rallypoint.coordinator.peer_auth import PeerKey

        self.member_id = member_id
        self.cluster_id = 0x62656E6368
        self.peer_key = PeerKey(b"bench-peer-secret-0123456789")
        self.incarnation = 1
        self.abstaining = False
        self.accepts_traffic = True
        self.stopping = False
        self.peer_names_required = False
        self.max_snapshot_bytes = 1 << 20
        self.addresses: dict[int, str] = {}
        self._on_message = on_message

    def deliver(self, messages: list[Any], incarnation: int, abstaining: bool) -> None:
        for _ in messages:
            self._on_message(b"")

    def validate_entries(self, entries: Any) -> None:
        pass

    def peer_address(self, member_id: int) -> str | None:
        return self.addresses.get(member_id)

    def peer_addresses(self) -> dict[int, str]:
        return dict(self.addresses)

    def learn_peer_address(self, member_id: int, address: str) -> None:
        pass

    def report_unreachable(self, member_id: int) -> None:
        pass

    def report_snapshot(self, member_id: int, ok: bool) -> None:
        pass


async def _peer_end(
    initiator: bool,
    on_message: Callable[[bytes], Any],
    pipe: multiprocessing.connection.Connection,
) -> tuple[Callable[[bytes], Any], Callable[[], Any]]:
    """One member's end of a peer probe: its receiver serving, its sender to the other."""
    import random

    from rallypoint.raft.types import Entry, Index, Message, MessageType, NodeId, Term

    me, other_id = (1, 2) if initiator else (2, 1)
    member = _BenchMember(me, on_message)
    rng = random.Random(me)
    from rallypoint.coordinator.peerwire.server import PeerListener
    from rallypoint.coordinator.peerwire.transport import StreamTransport

    server = PeerListener(member)  # type: ignore[arg-type]
    await server.start("127.0.0.1:0")
    port = server.port
    transport = StreamTransport(member, rng)  # type: ignore[arg-type]
    pipe.send(port)
    other = await asyncio.get_running_loop().run_in_executor(None, pipe.recv)
    member.addresses[other_id] = f"127.0.0.1:{other}"
    message = Message(
        type=MessageType.MsgApp,
        to=NodeId(other_id),
        from_=NodeId(me),
        term=Term(1),
        entries=(Entry(index=Index(1), term=Term(1), data=MESSAGE),),
    )

    async def send(_payload: bytes) -> None:
        transport.send([message])

    async def close() -> None:
        await transport.stop()
        await server.stop(None)

    return send, close


async def _unary_server(measured: int, pipe: multiprocessing.connection.Connection) -> None:
    counter = _Counter(measured)
    server, port = await _grpc_server(lambda _request: counter.note(), unary=True)
    pipe.send(port)
    await counter.done.wait()
    pipe.send({"cpu_s": counter.cpu_end_s - counter.cpu_start_s})
    pipe.recv()
    await server.stop(0)


async def _unary_client(measured: int, pipe: multiprocessing.connection.Connection) -> None:
    import grpc.aio

    port = pipe.recv()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(
            f"/{_SERVICE}/Call", request_serializer=_identity, response_deserializer=_identity
        )
        for _ in range(WARM_UP):
            await call(REQUEST)
        latencies: list[float] = []
        cpu_start = _cpu_s()
        for _ in range(measured):
            started = time.perf_counter()
            await call(REQUEST)
            latencies.append(time.perf_counter() - started)
        pipe.send({"latencies_s": latencies, "cpu_s": _cpu_s() - cpu_start})


def _process_main(role: str, measured: int, pipe: multiprocessing.connection.Connection) -> None:
    import uvloop

    if role == "unary_server":
        coroutine = _unary_server(measured, pipe)
    elif role == "unary_client":
        coroutine = _unary_client(measured, pipe)
    else:
        kind, end = role.split("_")
        coroutine = _stream_end(kind, end == "initiator", measured, pipe)
    uvloop.run(coroutine)


# --- the trials -------------------------------------------------------------------------------


def _receive(pipe: multiprocessing.connection.Connection, what: str) -> Any:
    if not pipe.poll(PROBE_LIMIT_S):
        raise TimeoutError(f"{what} did not answer within {PROBE_LIMIT_S:.0f} s")
    return pipe.recv()


def _start(
    context: Any, role: str, measured: int
) -> tuple[multiprocessing.process.BaseProcess, multiprocessing.connection.Connection]:
    mine, theirs = context.Pipe()
    process = context.Process(target=_process_main, args=(role, measured, theirs), daemon=True)
    process.start()
    return process, mine


def _finish(processes: Sequence[multiprocessing.process.BaseProcess]) -> None:
    for process in processes:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
            process.join()


def run_probe(probe: str, measured: int) -> dict[str, Any]:
    """One trial of ``probe``: its round trips and the CPU its processes spent."""
    context = multiprocessing.get_context("spawn")
    if probe == "grpc_unary":
        server, server_pipe = _start(context, "unary_server", measured)
        client, client_pipe = _start(context, "unary_client", measured)
        try:
            client_pipe.send(_receive(server_pipe, "the unary server"))
            client_result = _receive(client_pipe, "the unary client")
            server_result = _receive(server_pipe, "the unary server")
            server_pipe.send("stop")
        finally:
            _finish([client, server])
        return {
            **_figures(client_result, server_result, measured),
            "client_cpu_per_call_us": client_result["cpu_s"] / measured * 1e6,
            "server_cpu_per_call_us": server_result["cpu_s"] / measured * 1e6,
        }
    kind = "peer" if probe == "peer_stream" else probe.split("_")[0]
    responder, responder_pipe = _start(context, f"{kind}_responder", measured)
    initiator, initiator_pipe = _start(context, f"{kind}_initiator", measured)
    try:
        responder_port = _receive(responder_pipe, "the responder")
        initiator_port = _receive(initiator_pipe, "the initiator")
        responder_pipe.send(initiator_port)
        initiator_pipe.send(responder_port)
        _receive(responder_pipe, "the responder")
        _receive(initiator_pipe, "the initiator")
        responder_pipe.send("go")
        initiator_pipe.send("go")
        initiator_result = _receive(initiator_pipe, "the initiator")
        responder_result = _receive(responder_pipe, "the responder")
        initiator_pipe.send("stop")
        responder_pipe.send("stop")
    finally:
        _finish([initiator, responder])
    return _figures(initiator_result, responder_result, measured)


def _figures(timed: dict[str, Any], other: dict[str, Any], measured: int) -> dict[str, float]:
    """Round-trip percentiles from the end that timed them; CPU per message from both ends
    (each round trip, a call or a ping-pong, is two messages, each sent by one end and
    received by the other)."""
    latencies = sorted(timed["latencies_s"])
    return {
        "p50_us": percentile(latencies, 0.5) * 1e6,
        "p99_us": percentile(latencies, 0.99) * 1e6,
        "cpu_per_message_us": (timed["cpu_s"] + other["cpu_s"]) / (2 * measured) * 1e6,
    }


def summarize(trials: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {
        field: statistics.median(trial[field] for trial in trials) for field in trials[0]
    }
    summary["trials"] = trials
    return summary


def ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = list(results)
    colours = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3"][: len(names)]
    left.bar(names, [results[name]["p50_us"] for name in names], color=colours)
    left.set_title("round trip, p50 (us)")
    right.bar(names, [results[name]["cpu_per_message_us"] for name in names], color=colours)
    right.set_title("CPU per message, both ends (us)")
    for axes in (left, right):
        axes.tick_params(axis="x", labelrotation=15)
    figure.suptitle("one message through grpc.aio against plain TCP (uvloop), same machine")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.transport_bench",
        description=(
            "Measure what one message costs through grpc.aio (an empty unary call; a "
            "client-stream ping-pong as the peer transport uses) against plain TCP on "
            "uvloop: round-trip p50/p99 and CPU per message, in fresh processes on this "
            "machine. Writes JSON (and a plot beside it)."
        ),
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/transport.json"))
    parser.add_argument(
        "--messages", type=int, default=3000, help="measured round trips per trial (default 3000)"
    )
    parser.add_argument("--trials", type=int, default=3, help="trials per probe (default 3)")
    parser.add_argument(
        "--probes",
        default=",".join(PROBES),
        help=f"comma-separated subset of {', '.join(PROBES)} (default: all)",
    )
    parser.add_argument("--no-plot", action="store_true", help="write the JSON only")
    parser.add_argument(
        "--smoke", action="store_true", help="one trial of 200 round trips per probe"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.smoke:
        args.messages, args.trials = 200, 1
    if args.messages < 1:
        parser.error(f"--messages must be at least 1, got {args.messages}")
    if args.trials < 1:
        parser.error(f"--trials must be at least 1, got {args.trials}")
    probes = [name.strip() for name in args.probes.split(",") if name.strip()]
    unknown = [name for name in probes if name not in PROBES]
    if unknown or not probes:
        parser.error(
            f"--probes: unknown probe {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(PROBES)}"
        )
    # The probes' processes inherit this: gRPC's INFO lines (a GOAWAY as each probe's
    # connections close) are not figures.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    trials: dict[str, list[dict[str, Any]]] = {name: [] for name in probes}
    for number in range(args.trials):
        for name in probes:
            trial = run_probe(name, args.messages)
            trials[name].append(trial)
            print(
                f"trial {number + 1} {name}: p50 {trial['p50_us']:.0f} us, "
                f"CPU per message {trial['cpu_per_message_us']:.0f} us",
                flush=True,
            )
    results = {name: summarize(trials[name]) for name in probes}
    ratios: dict[str, float | None] = {
        "stream_cpu": None,
        "stream_p50": None,
        "peer_cpu": None,
        "peer_p50": None,
    }
    if "peer_stream" in results and "tcp_stream" in results:
        peer_stream, tcp = results["peer_stream"], results["tcp_stream"]
        ratios["peer_cpu"] = ratio(peer_stream["cpu_per_message_us"], tcp["cpu_per_message_us"])
        ratios["peer_p50"] = ratio(peer_stream["p50_us"], tcp["p50_us"])
    if "grpc_stream" in results and "tcp_stream" in results:
        grpc_stream, tcp_stream = results["grpc_stream"], results["tcp_stream"]
        ratios["stream_cpu"] = ratio(
            grpc_stream["cpu_per_message_us"], tcp_stream["cpu_per_message_us"]
        )
        ratios["stream_p50"] = ratio(grpc_stream["p50_us"], tcp_stream["p50_us"])
    document = {
        "benchmark": "transport",
        "machine": machine_info(),
        "versions": package_versions(["grpcio", "uvloop", "rallypoint"]),
        "placement": "both ends of every probe on this machine's cores, nothing else of the "
        "benchmark running; the parent only starts them and collects figures",
        "parameters": {
            "messages": args.messages,
            "trials": args.trials,
            "warm_up": WARM_UP,
            "request_bytes": len(REQUEST),
            "message_bytes": len(MESSAGE),
            "probes": probes,
            "smoke": args.smoke,
        },
        "results": results,
        "ratios": ratios,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.out, document, None if args.no_plot else lambda path: plot(results, path))

    def shown(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}x"

    unary = results.get("grpc_unary")
    unary_text = f"{unary['p50_us']:.0f} us" if unary else "n/a"
    print(
        f"transport: grpc_stream/tcp_stream cpu {shown(ratios['stream_cpu'])} "
        f"p50 {shown(ratios['stream_p50'])}; grpc_unary p50 {unary_text}; "
        f"peer_stream/tcp_stream cpu {shown(ratios['peer_cpu'])} p50 {shown(ratios['peer_p50'])}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
