"""The demo's training program: one elastic worker training a small MLP on synthetic data.

    python -m rallypoint.worker.demo_train --endpoints A,B,C --job demo --name w1 \\
        --checkpoint-dir DIR [--max-steps N] [--checkpoint-every K] [--restore auto|checkpoint]
        [--token TOKEN] [--fsdp] [--snapshot-every K [--snapshot-copies R | --snapshot-erasure
        K+M] [--host NAME] [--snapshot-dir DIR]]

``--fsdp`` shards the model over the world with FSDP2 (``fully_shard``), rebuilt at every
formation; ``--snapshot-every`` takes in-memory snapshots protected on workers of other hosts
(``--host`` names this worker's; by copies, or erasure-coded with ``--snapshot-erasure``),
from which a lost worker's shards come back; with ``--snapshot-dir`` (a tmpfs) they are kept
in files there, and workers started again after all of them died restore from them.

The data is a regression problem made from a fixed seed (the same in every process): inputs
drawn from a normal distribution, targets from a random "teacher" MLP plus a little noise,
so the loss visibly falls. Every worker prints one JSON line per event of the elastic loop
(``round_formed``, ``round_ended``, ``checkpoint_committed``...) and one ``step`` line per
counted step (the sampler's global step and the loss), each with the wall-clock time ``t``:
the demo's live view, the end-to-end tests and the recovery benchmark read these lines.
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from rallypoint.proto.v1.defaults import JOB_CONFIG

from .elastic import ElasticRun, EventHandler, RestoreMode, TrainState, elastic_training
from .sampler import ElasticSampler

NUM_SAMPLES, IN_FEATURES, HIDDEN, BATCH_SIZE = 8192, 16, 64, 32
DATA_SEED, MODEL_SEED, SAMPLER_SEED = 1234, 7, 0
LEARNING_RATE = 3e-3

_print_lock = threading.Lock()


def make_data() -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets, identical in every process."""
    generator = torch.Generator().manual_seed(DATA_SEED)
    inputs = torch.randn(NUM_SAMPLES, IN_FEATURES, generator=generator)
    teacher = [
        torch.randn(IN_FEATURES, HIDDEN, generator=generator) / IN_FEATURES**0.5,
        torch.randn(HIDDEN, 1, generator=generator) / HIDDEN**0.5,
    ]
    targets = torch.tanh(inputs @ teacher[0]) @ teacher[1]
    targets += 0.05 * torch.randn(NUM_SAMPLES, 1, generator=generator)
    return inputs, targets


def make_model() -> torch.nn.Module:
    torch.manual_seed(MODEL_SEED)
    return torch.nn.Sequential(
        torch.nn.Linear(IN_FEATURES, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, 1),
    )


def make_state(*, fsdp: bool = False) -> TrainState:
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    sampler = ElasticSampler(
        NUM_SAMPLES, batch_size=BATCH_SIZE, rank=0, world_size=1, seed=SAMPLER_SEED, drop_last=True
    )
    return TrainState(model, optimizer, sampler, build=build_sharded if fsdp else None)


def build_sharded() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model sharded with FSDP2 over every rank of the current world (each layer its
    own unit), and its optimizer: made again at every formation."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    model = make_model()
    for layer in model.children():
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)


def state_digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """SHA-256 over the bits of the model's and optimizer's state, in key order."""
    options = StateDictOptions(full_state_dict=True)
    model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
    digest = hashlib.sha256()

    def feed(prefix: str, obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            digest.update(prefix.encode())
            digest.update(obj.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(obj, Mapping):
            for key in sorted(obj, key=str):
                feed(f"{prefix}/{key}", obj[key])
        elif isinstance(obj, list | tuple):
            for index, value in enumerate(obj):
                feed(f"{prefix}[{index}]", value)
        else:
            digest.update(f"{prefix}={obj!r}".encode())

    feed("model", model_state)
    feed("optimizer", optimizer_state)
    return digest.hexdigest()


def emit(event: str, fields: Mapping[str, Any]) -> None:
    line = json.dumps({"event": event, **fields}, default=str)
    with _print_lock:
        print(line, flush=True)


def train(
    run: ElasticRun,
    *,
    checkpoint_every: int,
    step_sleep_s: float,
    after_formed: Callable[[ElasticRun], None] | None = None,
) -> None:
    """The training loop (the API's whole surface, as the README shows it)."""
    inputs, targets = make_data()
    state = run.state
    assert state.sampler is not None
    for round_ in run.rounds():
        if after_formed is not None:
            after_formed(run)
        # A sharded model is made again for each world (TrainState.build).
        model, optimizer = state.model, state.optimizer
        for batch in round_.batches():
            # FSDP2 runs collectives inside the forward and backward passes: a lost peer
            # ends the round there (round.step()); a replicated model's gradients are
            # reduced by the loop, abandonably.
            loss: torch.Tensor | None = None
            with round_.step():
                loss = torch.nn.functional.mse_loss(model(inputs[batch]), targets[batch])
                loss.backward()  # type: ignore[no-untyped-call]
                if state.build is None:
                    round_.all_reduce_gradients(model)
                optimizer.step()
                optimizer.zero_grad()
            loss_value = loss.item() if loss is not None else None
            sampler = state.sampler
            epoch, start = sampler.epoch, sampler.position
            if round_.step_done(checkpoint_every=checkpoint_every, loss=loss_value):
                emit(
                    "step",
                    {
                        "t": time.time(),
                        "name": run.name,
                        "round": round_.number,
                        "rank": round_.rank,
                        "world_size": round_.world_size,
                        "step": state.step,
                        "epoch": epoch,
                        "start": start,
                        "end": sampler.position,
                        "loss": loss_value,
                    },
                )
            else:
                # The step's collective was given up (the round ended under it): its work
                # is lost, nothing of it counts.
                emit(
                    "step_abandoned",
                    {
                        "t": time.time(),
                        "name": run.name,
                        "round": round_.number,
                        "step": state.step,
                    },
                )
            if step_sleep_s > 0:
                time.sleep(step_sleep_s)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--job", default="demo")
    parser.add_argument("--name", required=True)
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--min-nodes", type=int, default=2)
    parser.add_argument("--max-nodes", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--keep-checkpoints", type=int, default=JOB_CONFIG.keep_checkpoints)
    parser.add_argument("--restore", choices=["auto", "checkpoint"], default="auto")
    parser.add_argument("--step-sleep-s", type=float, default=0.0)
    parser.add_argument(
        "--heartbeat-interval-ms", type=int, default=JOB_CONFIG.heartbeat_interval_ms
    )
    # A pause the failure detector forgives: CPU-bound workers sharing a few cores with the
    # coordinator see heartbeats delayed by scheduling alone.
    parser.add_argument("--acceptable-pause-ms", type=int, default=1000)
    # The job's token when the cluster requires one (default: $RALLYPOINT_TOKEN).
    parser.add_argument("--token", default=None)
    # How long joining waits for a coordinator that cannot be reached (default: the join
    # timeout), and for a round to form.
    parser.add_argument("--connect-timeout-s", type=float, default=None)
    parser.add_argument("--join-timeout-s", type=float, default=JOB_CONFIG.join_timeout_ms / 1000)
    parser.add_argument("--fsdp", action="store_true", help="shard the model with FSDP2")
    parser.add_argument("--snapshot-every", type=int, default=0)
    parser.add_argument("--snapshot-copies", type=int, default=None, help="(default 2)")
    parser.add_argument(
        "--snapshot-erasure",
        type=erasure_code,
        default=None,
        metavar="K+M",
        help="erasure-code snapshots in groups of K with M parity shares instead of copies",
    )
    parser.add_argument("--host", default=None, help="this worker's failure domain")
    parser.add_argument(
        "--snapshot-dir", default=None, help="keep snapshots in files here (a tmpfs: /dev/shm)"
    )
    return parser.parse_args(argv)


def erasure_code(text: str) -> tuple[int, int]:
    """``--snapshot-erasure``'s value: ``K+M``, e.g. ``4+2``."""
    k, plus, m = text.partition("+")
    if not plus or not k.strip().isdigit() or not m.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected K+M, e.g. 4+2")
    return int(k), int(m)


def open_run(
    args: argparse.Namespace, state: TrainState, on_event: EventHandler = emit, **options: Any
) -> ElasticRun:
    restore: RestoreMode = args.restore
    return elastic_training(
        args.endpoints,
        job=args.job,
        name=args.name,
        state=state,
        checkpoint_dir=args.checkpoint_dir,
        min_nodes=args.min_nodes,
        max_nodes=args.max_nodes,
        max_steps=args.max_steps,
        keep_checkpoints=args.keep_checkpoints,
        restore=restore,
        heartbeat_interval_ms=args.heartbeat_interval_ms,
        acceptable_pause_ms=args.acceptable_pause_ms,
        on_event=on_event,
        token=args.token,
        connect_timeout_s=args.connect_timeout_s,
        join_timeout_s=args.join_timeout_s,
        snapshot_every=args.snapshot_every,
        snapshot_copies=args.snapshot_copies,
        snapshot_erasure=args.snapshot_erasure,
        snapshot_dir=args.snapshot_dir,
        host=args.host,
        **options,
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # `kill -USR1 <pid>` prints every thread's stack: where a stuck worker waits.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    torch.set_num_threads(1)
    state = make_state(fsdp=args.fsdp)
    with open_run(args, state) as run:
        train(run, checkpoint_every=args.checkpoint_every, step_sleep_s=args.step_sleep_s)
    sys.stdout.flush()
    # DCP's writer threads of abandoned rounds may still wait out their group's timeout;
    # the run's work is committed and flushed, so do not let interpreter exit join them.
    os._exit(0)


if __name__ == "__main__":
    main()
