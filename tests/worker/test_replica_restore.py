"""No rollback when the state is replicated across units (issue 37): a sharded model's new
world restored from the survivors that hold its shards (source ``replicas``).

- The choice (``choose_restore_source``): when every rank's pieces (model and optimizer,
  by layout: name, global offset, local shape, dtype) are held by a survivor at the most
  advanced step, REPLICAS with nothing rolled back, each rank keeping what it holds and
  receiving the rest; when a piece is held by nobody (a model sharded across units, FSDP
  over dp), or only by a survivor a step behind, the fallback is exactly today's (memory,
  disk, fresh), the reason naming the missing piece.
- Real processes (tests/worker/replica_ranks.py, gloo, no coordinator): a dp=2 x 2 mesh
  job (mesh_train's model, tensor parallel inside a unit and replicated over dp, or HSDP
  whose shard group is the unit) trains 3 steps; a world with two newcomers in place of a
  unit restores at step 3 from the survivors (the newcomers receive every piece,
  bit-identical to what the survivors held, optimizer state included) and trains on with
  the replicas equal; a world of one unit
  (dp one smaller) restores at step 3 keeping its own pieces.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rallypoint.worker import (
    PeerState,
    RegisteredSnapshot,
    RestorePolicy,
    RestoreSource,
    choose_restore_source,
)
from rallypoint.worker.restore_choice import ShardKey, optimizer_needs, plan_from_replicas
from rallypoint.worker.snapshots import MemoryHolding
from tests.worker.test_checkpoint import wait_ranks

POLICY = RestorePolicy()
RANKS_SCRIPT = Path(__file__).with_name("replica_ranks.py")


def tp_pieces(position: int, *, optimizer: bool) -> tuple[ShardKey, ...]:
    """What a rank at tensor-parallel ``position`` (of 2) holds of a 2-layer model: the
    first layer split by rows, the second replicated; with Adam's state if ``optimizer``."""
    weight: ShardKey = ("model.0.weight", (8 * position, 0), (8, 4), "float32")
    bias: ShardKey = ("model.1.bias", (0,), (2,), "float32")
    keys = [weight, bias]
    if optimizer:
        for name, offset, shape, dtype in (weight, bias):
            parameter = name.removeprefix("model.")
            keys += [
                (f"optimizer.{parameter}.exp_avg", offset, shape, dtype),
                (f"optimizer.{parameter}.exp_avg_sq", offset, shape, dtype),
                (f"optimizer.{parameter}.step", (), (), "float32"),
            ]
    return tuple(sorted(keys))


def peer(
    rank: int,
    step: int | None,
    needs_position: int,
    held_position: int | None = None,
    **kw: Any,
) -> PeerState:
    """A rank of a sharded model: a survivor at ``step`` holding ``held_position``'s pieces
    (None: a newcomer), needing ``needs_position``'s model pieces in the new world."""
    holds = tp_pieces(held_position, optimizer=True) if held_position is not None else None
    return PeerState(
        rank,
        step is not None,
        False,
        step,
        state_bytes=1000,
        holds=holds,
        needs=tp_pieces(needs_position, optimizer=False),
        **kw,
    )


# -- the choice --------------------------------------------------------------------------


def test_a_lost_unit_is_restored_from_the_other_units_replicas_without_rollback() -> None:
    # dp=3 x tp=2 lost a rank of unit 1; units 0 and 2 re-form as dp=2 (old ranks 4, 5 are
    # now 2, 3), every position held by two survivors: nothing to move, nothing lost.
    peers = [peer(rank, 40, rank % 2, rank % 2) for rank in range(4)]
    decision = choose_restore_source(peers, checkpoint_step=30, policy=POLICY)
    assert decision.source is RestoreSource.REPLICAS, decision
    assert decision.steps_rolled_back == 0
    assert decision.plan is not None
    assert all(sender == receiver for receiver, sender, _ in decision.plan.transfers)
    # Every rank's model pieces and their optimizer state (exp_avg, exp_avg_sq, step).
    assert len(decision.plan.transfers) == 4 * len(tp_pieces(0, optimizer=True))


def test_newcomers_receive_each_piece_from_a_survivor_holding_it() -> None:
    # A spare unit (ranks 2, 3) takes the lost unit's place at dp=2.
    peers = [peer(0, 40, 0, 0), peer(1, 40, 1, 1), peer(2, None, 0), peer(3, None, 1)]
    decision = choose_restore_source(peers, checkpoint_step=30, policy=POLICY)
    assert decision.source is RestoreSource.REPLICAS and decision.plan is not None
    assert decision.src_rank == 0 and decision.plan.progress_rank == 0
    senders = {(receiver, sender) for receiver, sender, _ in decision.plan.transfers}
    assert senders == {(0, 0), (1, 1), (2, 0), (3, 1)}


def test_optimizer_needs_follow_the_holders_layout() -> None:
    needs = optimizer_needs(tp_pieces(1, optimizer=False), tp_pieces(0, optimizer=True))
    assert ("optimizer.0.weight.exp_avg", (8, 0), (8, 4), "float32") in needs
    assert ("optimizer.0.weight.step", (), (), "float32") in needs
    assert len(needs) == 6


def test_a_piece_no_survivor_holds_falls_back_as_before() -> None:
    # FSDP over dp: the new world cuts the weight at offsets no survivor holds whole.
    peers = [peer(rank, 40, 0, 0) for rank in range(2)]
    resharded = (("model.0.weight", (4, 0), (12, 4), "float32"),)
    peers[1] = PeerState(1, True, False, 40, 1000, holds=peers[1].holds, needs=resharded)
    memory = RegisteredSnapshot(round=3, step=38, world_size=2)
    holdings = [MemoryHolding(f"addr{rank}", (0, 1), True) for rank in range(2)]
    peers = [
        PeerState(p.rank, True, False, 40, 1000, memory=h, holds=p.holds, needs=p.needs)
        for p, h in zip(peers, holdings, strict=True)
    ]
    decision = choose_restore_source(peers, 30, POLICY, memory)
    assert decision.source is RestoreSource.MEMORY, decision
    assert decision.steps_rolled_back == 2
    assert "no survivor at step 40 holds model.0.weight at offset [4, 0]" in decision.reason
    assert choose_restore_source(peers, 30, POLICY).source is RestoreSource.DISK


def test_a_piece_held_only_by_a_survivor_a_step_behind_is_not_used() -> None:
    # Position 1's only holder abandoned step 41 (a step behind the others): its piece is
    # not the state after step 41, so the world falls back rather than mixing steps.
    peers = [peer(0, 41, 0, 0), peer(1, 40, 1, 1), peer(2, 41, 0, 0), peer(3, None, 1)]
    decision = choose_restore_source(peers, checkpoint_step=30, policy=POLICY)
    assert decision.source is RestoreSource.DISK, decision
    assert decision.steps_rolled_back == 11
    assert "no survivor at step 41 holds model.0.weight at offset [8, 0]" in decision.reason


def test_a_survivor_a_step_behind_is_healed_from_one_ahead() -> None:
    peers = [peer(0, 41, 0, 0), peer(1, 41, 1, 1), peer(2, 40, 0, 0), peer(3, 41, 1, 1)]
    decision = choose_restore_source(peers, checkpoint_step=30, policy=POLICY)
    assert decision.source is RestoreSource.REPLICAS and decision.plan is not None
    # Rank 2 keeps nothing of its own (a step behind): every piece comes from a survivor at
    # step 41 (its weight from rank 0, the only one at that position; step counts, the same
    # on every rank, from any).
    senders = {sender for receiver, sender, _ in decision.plan.transfers if receiver == 2}
    assert 2 not in senders and senders <= {0, 1, 3}, senders
    weight_from = {s for r, s, key in decision.plan.transfers if r == 2 and key[1] == (0, 0)}
    assert weight_from == {0}, weight_from


def test_survivors_older_than_the_checkpoint_do_not_restore() -> None:
    peers = [peer(rank, 20, rank % 2, rank % 2) for rank in range(2)]
    decision = choose_restore_source(peers, checkpoint_step=30, policy=POLICY)
    assert decision.source is RestoreSource.DISK


def test_without_layouts_a_sharded_model_falls_back_as_before() -> None:
    peers = [PeerState(rank, True, False, 40, 1000) for rank in range(2)]
    decision = choose_restore_source(peers, checkpoint_step=30, policy=POLICY)
    assert decision.source is RestoreSource.DISK
    assert decision.reason == "the model is sharded, no rank holds a full replica"
    assert isinstance(plan_from_replicas(peers, 40), str)


# -- real processes ----------------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for probe in sockets:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["replicate", "hsdp"])
def test_a_job_replicated_over_dp_resumes_at_the_survivors_step(tmp_path: Path, mode: str) -> None:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONFAULTHANDLER": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "PORTS": ",".join(map(str, free_ports(3))),
    }
    ranks = [
        subprocess.Popen(
            [sys.executable, str(RANKS_SCRIPT), str(rank), str(tmp_path), mode],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(4)
    ]
    wait_ranks(ranks, [0] * 4, 240)

    def figures(world: int, rank: int) -> dict[str, Any]:
        path = tmp_path / f"world{world}-rank{rank}.json"
        result: dict[str, Any] = json.loads(path.read_text())
        return result

    swapped = [figures(2, rank) for rank in range(4)]
    for rank, world2 in enumerate(swapped):
        assert world2["source"] == "replicas", world2
        assert world2["step"] == 3 and world2["extra"] == {"schedule": "survivors'"}, world2
        # Bit-identical to what the survivors held under the same layout, optimizer too.
        assert world2["restored_equal_held"], world2
        assert world2["optimizer_pieces"] == 3 * world2["model_pieces"], world2
        assert world2["trained_on"], world2
        # Old ranks 2 and 3 came back as newcomers: they received; survivors kept theirs.
        assert (world2["bytes_moved"] > 0) == (rank >= 2), world2
    for rank in (2, 3):
        shrunk = figures(3, rank)
        assert shrunk["source"] == "replicas" and shrunk["step"] == 3, shrunk
        assert shrunk["restored_equal_held"] and shrunk["bytes_moved"] == 0, shrunk


def test_a_module_holding_other_tensors_than_its_optimizer_offers_nothing() -> None:
    import torch

    from rallypoint.worker.replica_restore import held_state

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    assert held_state(model, optimizer) is not None
    # As FSDP2 leaves a module whose forward pass was given up: its unsharded tensors in
    # place of the parameters the optimizer steps.
    model.weight = torch.nn.Parameter(torch.zeros(2, 4))
    assert held_state(model, optimizer) is None
