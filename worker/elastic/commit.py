"""Checkpoint commit: the protocol that makes a round's checkpoint (and its in-memory
snapshot) count, fenced by the round.

Theory of operation. ``step_done(checkpoint_every=N)`` starts ``Checkpointer.save_async``
every N steps (training goes on while DCP writes, one directory per step and round). The
commit protocol runs on a per-round commit thread, fenced by the round: when its save is
durable, rank 0 calls ``begin`` (step, world size, layout, uri) and publishes the checkpoint
id in the round store; every rank reports ``shard_done`` and marks its report in the store;
rank 0 waits for every rank's mark, then commits with the round's fencing token and deletes
the checkpoints the registry retired (it keeps the last ``keep_checkpoints``). Everything the
commit thread does names the round, so a zombie (a worker paused past its detection and
resumed) is refused: its begin, report, commit and store writes raise StaleRoundError or
StaleTokenError; they are reported as a ``checkpoint_refused`` event, never retried.

An in-memory snapshot every rank protected is registered the same way, by rank 0's
protection thread (``register_snapshot``), fenced by the round.
"""

from __future__ import annotations

import concurrent.futures
from typing import TYPE_CHECKING

from rallypoint.client import (
    RallypointError,
    RoundInfo,
    StaleRoundError,
    StaleTokenError,
    SyncCheckpointRegistry,
    SyncRoundStore,
)

from .state import RunView

if TYPE_CHECKING:
    from ..checkpoint import Checkpointer, PendingCheckpoint
    from ..snapshots import SnapshotId, SnapshotPlacement

# Round-store keys of the commit protocol (the store is the round's own: no clash with c10d's).
CHECKPOINT_KEY = "rallypoint/checkpoint/{step}"
REPORTED_KEY = "rallypoint/checkpoint/{step}/reported/{rank}"


def round_store(run: RunView, info: RoundInfo) -> SyncRoundStore:
    """The store of round ``info`` as this worker's participant sees it."""
    return run.client.round_store(info.job, info.round, run.participant.participant_id)


def round_registry(run: RunView, info: RoundInfo) -> SyncCheckpointRegistry:
    """The checkpoint registry fenced by round ``info`` and its token."""
    return run.client.checkpoint_registry(info)


class RoundCommits:
    """The commits of one round: its checkpointer, its commit thread and their reports."""

    def __init__(self, run: RunView, info: RoundInfo, rank: int) -> None:
        self._run = run
        # The round whose commits these are.
        self.info = info
        self._rank = rank
        # Made at the round's first checkpoint (a collective: its own gloo group).
        self.checkpointer: Checkpointer | None = None
        # One thread per round reports checkpoints: a report stuck on a dead round must not
        # delay the next round's.
        self._thread = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix=f"rallypoint-commit-r{info.round}"
        )
        self.pending: list[concurrent.futures.Future[None]] = []
        # The round ended by plan at the coordinator and its final memory snapshot is being
        # taken: registered fenced by this ended round (``ElasticRound.final_snapshot``).
        self.planned_end = False

    def submit(self, pending: PendingCheckpoint) -> None:
        """Commit ``pending`` once it is saved, on the commit thread (in order, one save
        after another)."""
        self.pending.append(self._thread.submit(self.report, pending))

    def wait(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the reports submitted so far."""
        concurrent.futures.wait(self.pending, timeout=timeout_s)

    def shutdown(self) -> None:
        """No more reports; those running go on (a report stuck on a dead round is not
        waited for)."""
        self._thread.shutdown(wait=False)

    def release_checkpointer(self) -> Checkpointer | None:
        """The round's checkpointer, handed to the caller (the run's teardown)."""
        checkpointer, self.checkpointer = self.checkpointer, None
        return checkpointer

    def report(self, pending: PendingCheckpoint) -> None:
        """The commit protocol for one save (see the module docstring); commit thread."""
        run, info, rank, step = self._run, self.info, self._rank, pending.step
        fields = {"round": info.round, "rank": rank, "step": step}
        try:
            saved = pending.wait()
            run.emit("checkpoint_saved", **fields, path=str(saved.path), bytes=saved.bytes_total)
            registry, store = round_registry(run, info), round_store(run, info)
            key = CHECKPOINT_KEY.format(step=step)
            wait_s = run.settings.collective_timeout_s
            if rank == 0:
                checkpoint_id = registry.begin(
                    step,
                    uri=str(saved.path),
                    layout=pending.layout.to_bytes(),
                    world_size=info.world_size,
                )
                store.set(key, str(checkpoint_id))
            else:
                checkpoint_id = int(store.get(key, timeout_s=wait_s))
            registry.shard_done(checkpoint_id, rank)
            store.set(REPORTED_KEY.format(step=step, rank=rank), b"1")
            if rank != 0:
                return
            store.wait(
                [REPORTED_KEY.format(step=step, rank=r) for r in range(info.world_size)],
                timeout_s=wait_s,
            )
            run.emit("committing", **fields, checkpoint_id=checkpoint_id)
            result = registry.commit(checkpoint_id)
            from ..checkpoint import delete_checkpoints  # loaded by the save already

            deleted = delete_checkpoints(run.checkpoint_dir, [c.uri for c in result.retired])
            run.emit(
                "checkpoint_committed",
                **fields,
                checkpoint_id=checkpoint_id,
                path=str(saved.path),
                deleted=[str(p) for p in deleted],
            )
        except (StaleRoundError, StaleTokenError) as error:
            run.emit("checkpoint_refused", **fields, error=f"{type(error).__name__}: {error}")
        except (RallypointError, RuntimeError, OSError) as error:
            # The round ended under the save, or the coordinator could not be reached in
            # time: this checkpoint is not committed; the next one will be.
            run.emit("checkpoint_failed", **fields, error=f"{type(error).__name__}: {error}")

    def register_snapshot(
        self, snapshot: SnapshotId, world_size: int, placement: SnapshotPlacement
    ) -> bool:
        """Register a snapshot every rank protected (rank 0's protection thread): fenced by
        this round, so a zombie's is refused. Whether it was registered."""
        run = self._run
        fields = {"round": self.info.round, "rank": self._rank, "step": snapshot.step}
        from ..checkpoint import describe_layout  # loaded by the formation's restore

        try:
            round_registry(run, self.info).commit_memory_snapshot(
                snapshot.step,
                world_size,
                layout=describe_layout(run.state.model, world_size).to_bytes(),
                placement=placement.to_bytes(),
                planned_end=self.planned_end,
            )
        except (StaleRoundError, StaleTokenError) as error:
            run.emit("snapshot_refused", **fields, error=f"{type(error).__name__}: {error}")
            return False
        except RallypointError as error:
            run.emit("snapshot_failed", **fields, error=f"{type(error).__name__}: {error}")
            return False
        blocked_s = run.memory.last_blocked_s if run.memory is not None else 0.0
        run.emit("snapshot_committed", **fields, blocked_s=blocked_s, final=self.planned_end)
        return True
