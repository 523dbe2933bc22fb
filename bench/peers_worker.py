"""One data-parallel training process of the peers benchmark (bench/peers_bench.py), under one
of three systems: plain DDP (torch.distributed, a static world), torchft 0.2.0 (a Manager per
replica, its DDP and optimizer wrappers) or rallypoint (``elastic_training``); or under none
(``cold_floor``: a cold process's imports, model and one step alone, the floor below any
system's cold replacement; ``run_cold_floor``).

    python -m bench.peers_worker --system plain|torchft|rallypoint|cold_floor --index I \
        --stop-file F ...

The workload is the same under each: a 1.3 M-parameter MLP (512 -> 1024 -> 512 -> 512, ReLU),
AdamW, 32 samples a step per process from a dataset every process makes from one seed, one
torch thread. The process prints one JSON line per event on stdout, each with the wall clock
``t``: ``imported`` (torch and the system's library imported), ``joined`` (connected to the
system's coordinator: the torchft Manager made and heartbeating its lighthouse, rallypoint's
``joined`` event, plain DDP's process group formed), ``step`` (a step every rank counted, with
the world's step number and the number of processes that took it) and, once the world's step
reaches the number the bench wrote to ``--stop-file``, ``checksum`` (SHA-256 of the
parameters and the optimizer state), after which it leaves. Steps the system abandoned (a
peer lost mid all-reduce) are not counted and print nothing.

Imports are timed: the module imports only the standard library at the top, so
``imported - start`` is what a replacement pays before it can talk to anyone.

Its way in is also printed as ``phase`` events, each when that phase ends, the same names
for both elastic systems where they mean the same thing: ``interpreter`` (this module
starts running), ``torch`` (``import torch``), ``library`` (torchft's or rallypoint's
imports), ``model`` (model and AdamW made; AdamW's first use imports ``torch._dynamo``),
``connect`` and ``session`` (rallypoint only: its client's channel, its session opened),
``join`` (rallypoint's Join answered; torchft's Manager made, heartbeating its lighthouse),
``round`` (rallypoint: the round with this process ACTIVE; torchft: the lighthouse's quorum
answered), ``group`` (the round's gloo group initialised; torchft: ``pg.configure``
returned), ``restore`` (the world's state installed in this process) and the first
``step``. rallypoint's client has no events for its channel, session and Join, and torchft's
Manager none for its phases, so the worker wraps the methods that perform them to note when
they return; the wrapping changes no argument and no result.

Under the warm launcher (``python -m rallypoint.worker.warm ... -- bench/peers_worker.py
...``, the peers benchmark's ``rallypoint_warm``) the process is a fork of the launcher, whose
imports it finds done; it prints ``forked`` first, at the fork's wall clock, which is where
its way in starts (``interpreter``: from the fork to this module's first line).
"""

from __future__ import annotations

import time

STARTED_T = time.time()  # before anything else: the interpreter's own start is a phase

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING, Any  # noqa: E402

if TYPE_CHECKING:
    import torch

IN_FEATURES, HIDDEN, OUT_FEATURES = 512, 1024, 512
BATCH_SIZE, NUM_SAMPLES = 32, 4096
DATA_SEED, MODEL_SEED = 1234, 7
LEARNING_RATE = 1e-3
# torchft's own example (train_ddp.py) sets these for gloo on CPU; its defaults are 60 s each,
# under which a survivor blocked in gloo would wait a minute.
TORCHFT_GLOO_TIMEOUT_S = 5.0
TORCHFT_MANAGER_TIMEOUT_S = 30.0


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


def phase(name: str, t: float | None = None) -> None:
    """Note that the phase ``name`` of this process's way in ended (at ``t``: now)."""
    emit("phase", phase=name, **({} if t is None else {"t": t}))


class Once:
    """Notes a phase the first time the wrapped callable returns (later calls: nothing)."""

    def __init__(self, name: str, call: Callable[..., Any]) -> None:
        self.name, self.call, self.done = name, call, False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = self.call(*args, **kwargs)
        if not self.done:
            self.done = True
            phase(self.name)
        return result


class Proxy:
    """Forwards every attribute to ``inner`` but ``wrapped``'s (torchft's Rust client has no
    settable attributes)."""

    def __init__(self, inner: Any, **wrapped: Callable[..., Any]) -> None:
        self._inner, self._wrapped = inner, wrapped

    def __getattr__(self, name: str) -> Any:
        return self._wrapped.get(name) or getattr(self._inner, name)


def make_model() -> torch.nn.Module:
    import torch

    torch.manual_seed(MODEL_SEED)
    return torch.nn.Sequential(
        torch.nn.Linear(IN_FEATURES, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, OUT_FEATURES),
        torch.nn.ReLU(),
        torch.nn.Linear(OUT_FEATURES, OUT_FEATURES),
    )


def make_data() -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    generator = torch.Generator().manual_seed(DATA_SEED)
    inputs = torch.randn(NUM_SAMPLES, IN_FEATURES, generator=generator)
    targets = torch.randn(NUM_SAMPLES, OUT_FEATURES, generator=generator)
    return inputs, targets


def state_checksum(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """SHA-256 over every parameter and every optimizer state tensor and scalar, in a fixed
    order: two processes print the same digest exactly when their states are bit-identical."""
    import torch

    digest = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            tensor = value.detach().contiguous().cpu()
            digest.update(str((tensor.dtype, tuple(tensor.shape))).encode())
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            digest.update(repr(value).encode())

    for name, parameter in model.named_parameters():
        digest.update(name.encode())
        feed(parameter)
    for index, parameter in enumerate(model.parameters()):
        for key, value in sorted(optimizer.state.get(parameter, {}).items()):
            digest.update(f"{index}.{key}".encode())
            feed(value)
    return digest.hexdigest()


class StopFile:
    """The step the bench asks every process to stop at, read once it appears."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.step: int | None = None

    def reached(self, step: int) -> bool:
        if self.step is None and self.path.exists():
            text = self.path.read_text().strip()
            if text:  # the bench writes it atomically, but an empty read costs nothing
                self.step = int(text)
        return self.step is not None and step >= self.step


def batches(index: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    inputs, targets = make_data()
    position = (index * 8 * BATCH_SIZE) % NUM_SAMPLES
    while True:
        yield inputs[position : position + BATCH_SIZE], targets[position : position + BATCH_SIZE]
        position = (position + BATCH_SIZE) % NUM_SAMPLES


def run_plain(args: argparse.Namespace, stop: StopFile) -> None:
    import torch
    import torch.distributed as dist

    emit("imported")
    store = dist.TCPStore(
        "127.0.0.1", args.master_port, args.world, is_master=args.index == 0, use_libuv=True
    )
    dist.init_process_group("gloo", store=store, rank=args.index, world_size=args.world)
    model = torch.nn.parallel.DistributedDataParallel(make_model())
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    emit("joined")
    for step, (x, y) in enumerate(batches(args.index), start=1):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        emit("step", step=step, world_size=args.world)
        if stop.reached(step):
            emit("checksum", step=step, checksum=state_checksum(model.module, optimizer))
            break
    dist.destroy_process_group()


def surviving_ddp(stock: type[Any]) -> type[Any]:
    """torchft 0.2.0's ``DistributedDataParallel`` with the one change that lets a replica
    survive a peer killed mid all-reduce. Its comm hook waits on the manager's all-reduce and
    then asserts that the work's inner future exists; when the all-reduce failed (the peer's
    socket reset), ``wait()`` has returned False after reporting the error to the manager and
    the inner future is None, so the assertion kills the survivor in ``backward()`` (and once
    the manager has errored, ``allreduce`` returns a ``_DummyWork`` whose plain future has no
    inner future at all). Here a failed or dummy all-reduce hands DDP the bucket as it is: the
    manager already knows the step failed, and ``should_commit`` refuses it on every replica,
    as torchft intends."""
    import torch

    class SurvivingDistributedDataParallel(stock):  # type: ignore[misc,valid-type]
        # No annotations: DDP checks a hook's annotations against its own classes, and this
        # module's are strings (from __future__ import annotations).
        @staticmethod
        def _comm_hook(state, bucket):  # type: ignore[no-untyped-def]
            work = state.allreduce(bucket.buffer())
            succeeded = work.wait()
            future = work.get_future()
            inner = getattr(future, "_fut", future)
            if succeeded and inner is not None:
                return inner
            failed: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            failed.set_result(bucket.buffer())
            return failed

    return SurvivingDistributedDataParallel


def run_torchft(args: argparse.Namespace, stop: StopFile) -> None:
    import torch

    phase("torch")
    import torch.distributed as dist
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo
    from torchft.checkpointing.pg_transport import PGTransport

    phase("library")
    emit("imported")
    # Each process is a replica group of one; its group's store is its own (torchrun would
    # start it), which the other replicas reach through the quorum when this one leads it.
    store = dist.TCPStore("127.0.0.1", args.store_port, 1, is_master=True, wait_for_workers=False)
    model = make_model()
    inner = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    phase("model")

    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])
        phase("restore")

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    gloo = ProcessGroupGloo(timeout=timedelta(seconds=TORCHFT_GLOO_TIMEOUT_S))
    gloo.configure = Once("group", gloo.configure)
    manager = Manager(
        pg=gloo,
        min_replica_size=args.min_world,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"peers_{args.index}",
        timeout=timedelta(seconds=TORCHFT_MANAGER_TIMEOUT_S),
        store_addr="127.0.0.1",
        store_port=args.store_port,
        rank=0,
        world_size=1,
        lighthouse_addr=f"http://127.0.0.1:{args.lighthouse_port}",
        port=args.manager_port,
        hostname="127.0.0.1",
        checkpoint_transport=PGTransport(
            gloo, timeout=timedelta(seconds=10), device=torch.device("cpu")
        ),
    )
    phase("join")
    emit("joined")
    manager._client = Proxy(manager._client, _quorum=Once("round", manager._client._quorum))
    ddp = surviving_ddp(DistributedDataParallel)(manager, model)
    optimizer = Optimizer(manager, inner)
    for x, y in batches(args.index):
        optimizer.zero_grad()  # starts the step's quorum
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        before = manager.current_step()
        optimizer.step()  # steps only if every replica in the quorum commits
        if manager.current_step() == before:
            continue
        step = manager.current_step()
        emit("step", step=step, world_size=manager.num_participants())
        if stop.reached(step):
            emit("checksum", step=step, checksum=state_checksum(model, inner))
            break
    del store
    manager.shutdown(wait=False)


def run_rallypoint(args: argparse.Namespace, stop: StopFile) -> None:
    import torch

    phase("torch")
    from rallypoint.worker import ElasticSampler, TrainState, elastic_training

    phase("library")
    emit("imported")
    instrument_rallypoint_client()
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    phase("model")
    inputs, targets = make_data()
    sampler = ElasticSampler(NUM_SAMPLES, batch_size=BATCH_SIZE, rank=0, world_size=1)
    state = TrainState(model, optimizer, sampler)
    formed = False

    def on_event(kind: str, fields: dict[str, Any]) -> None:
        nonlocal formed
        if kind == "joined":
            emit("joined")
        elif kind == "round_formed":
            emit("round_formed", **{k: fields.get(k) for k in ("round", "step", "source")})
            if not formed:
                # formed_s runs from the round's ACTIVE notice; init_s is the group's part.
                formed, noticed = True, fields["t"] - fields["formed_s"]
                phase("round", noticed)
                phase("group", noticed + fields["init_s"])
                phase("restore", fields["t"])

    with elastic_training(
        args.endpoints,
        job=args.job,
        name=f"w{args.index}",
        min_nodes=args.min_world,
        max_nodes=args.world,
        checkpoint_dir=args.checkpoint_dir,
        state=state,
        on_event=on_event,
    ) as run:
        done = False
        for round_ in run.rounds():
            for batch in round_.batches():
                torch.nn.functional.mse_loss(model(inputs[batch]), targets[batch]).backward()
                if round_.all_reduce_gradients(model):
                    optimizer.step()
                optimizer.zero_grad()
                if not round_.step_done():
                    continue
                emit("step", step=state.step, world_size=round_.world_size)
                if stop.reached(state.step):
                    emit("checksum", step=state.step, checksum=state_checksum(model, optimizer))
                    done = True
                    break
            if done:
                break


def run_cold_floor(args: argparse.Namespace, stop: StopFile) -> None:
    """No system: what any replacement that starts cold does before it could take part in a
    step (``import torch``, ``torch.distributed``, the model and AdamW, whose first use
    imports ``torch._dynamo``), then one step alone on its own batch. The bench's
    ``cold_floor``: no coordinator, no peer and no state to receive make it the least any
    system's cold replacement can take to its first step. ``library`` here is
    ``torch.distributed``, which every system's replacement imports before its first
    collective (torchft with its own package, rallypoint's worker when it forms a group)."""
    import torch

    phase("torch")
    import torch.distributed  # timed, not used: see the docstring

    phase("library")
    emit("imported")
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    phase("model")
    inputs, targets = next(batches(args.index))
    torch.nn.functional.mse_loss(model(inputs), targets).backward()
    optimizer.step()
    emit("step", step=1, world_size=1)
    emit("checksum", step=1, checksum=state_checksum(model, optimizer))


def instrument_rallypoint_client() -> None:
    """Note rallypoint's client connected, its first session opened and its first Join
    answered (the module docstring says why and how)."""
    from rallypoint.client import aio, session

    def once(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        noted = False

        async def timed(*args: Any, **kwargs: Any) -> Any:
            nonlocal noted
            result = await call(*args, **kwargs)
            if not noted:
                noted = True
                phase(name)
            return result

        return timed

    aio.Client.connect = once("connect", aio.Client.connect)  # type: ignore[method-assign]
    ensure = once("session", session.SessionKeeper.ensure)
    session.SessionKeeper.ensure = ensure  # type: ignore[method-assign]
    aio.Client.join = once("join", aio.Client.join)  # type: ignore[method-assign]


RUNNERS: dict[str, Callable[[argparse.Namespace, StopFile], None]] = {
    "plain": run_plain,
    "torchft": run_torchft,
    "rallypoint": run_rallypoint,
    "cold_floor": run_cold_floor,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", choices=sorted(RUNNERS), required=True)
    parser.add_argument("--index", type=int, required=True, help="rank (plain) or replica")
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--min-world", type=int, default=3)
    parser.add_argument("--stop-file", type=Path, required=True)
    parser.add_argument("--master-port", type=int, default=0, help="plain: rank 0's TCPStore")
    parser.add_argument("--store-port", type=int, default=0, help="torchft: this replica's")
    parser.add_argument("--manager-port", type=int, default=0, help="torchft: its Manager")
    parser.add_argument("--lighthouse-port", type=int, default=0, help="torchft")
    parser.add_argument("--endpoints", default="", help="rallypoint: the cluster")
    parser.add_argument("--job", default="peers", help="rallypoint: the job id")
    parser.add_argument("--checkpoint-dir", default="", help="rallypoint (never written)")
    args = parser.parse_args(argv)
    forked_at = os.environ.get("RALLYPOINT_WARM_FORKED_AT")
    if forked_at is not None:  # a warm launcher's child (worker/warm.py): it starts at the fork
        emit("forked", t=float(forked_at), restart=int(os.environ["RALLYPOINT_WARM_RESTART"]))
    phase("interpreter", STARTED_T)
    RUNNERS[args.system](args, StopFile(args.stop_file))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
