"""The elastic training loop: rounds of a process group that re-form in the same process.

Typical use (one process per worker; every worker runs the same code)::

    state = TrainState(model, optimizer, sampler)
    with elastic_training(endpoints, job="demo", name=name, min_nodes=2, max_nodes=4,
                          checkpoint_dir=root, state=state, max_steps=500) as run:
        for round in run.rounds():                 # each a formed group, state restored
            for batch in round.batches():          # ends early when the world changes
                loss = loss_fn(model(x[batch]), y[batch])
                loss.backward()
                round.all_reduce_gradients(model)  # abandoned (grads cleared) on a change
                optimizer.step()
                optimizer.zero_grad()
                round.step_done(checkpoint_every=50)

Theory of operation.

Rounds. The worker joins the job (``Participant``) once. ``rounds()`` waits for the next
ACTIVE round that includes it, then forms the round: the round store becomes a c10d store
(:class:`CoordinatorStore`), ``init_process_group`` (gloo on CPU, nccl on GPU) bootstraps
through it, and the state is restored (below). The round object is handed to the user's
loop. The round *ends* when any of these happen: the coordinator pushes a new (round, state)
(``on_round_change``: a member failed, left, was evicted, a worker waits to scale up), the
participant is lost, or a collective fails or passes its deadline. An ended round's
``batches()`` stops, so the user's loop falls back to ``rounds()``, which tears the group
down and forms the next round. No process restarts; the user's code has no try/except.

Planned changes. A round the coordinator ended while every one of its members is still in
the job (an operator drained a host, a waiting worker scaled the job up) costs no step: the
workers are all alive, so the step in flight completes, and the round ends at a step boundary
every rank agrees on (``ElasticRound.end_at_step_boundary``; ``joining.is_planned`` tells a
planned change from a loss by the next round's members and waiters). Each step carries an
agreement: the flat gradient all-reduce (``all_reduce_gradients``) carries one more element,
each rank's vote (1 once it saw the planned change), and a step without it (a sharded model's
``round.step()``, a loop reducing its own gradients) makes one one-element all-reduce in
``step_done``. The reduced vote is the same on every rank, so every rank stops after the same
step, counts it, and the next round restores by KEEP. A sharded model cannot keep (it is
rebuilt for the next mesh and restored from the newest registered memory snapshot), so with
in-memory snapshots on, its ranks take and register a snapshot of that agreed step before they
leave the round (``ElasticRound.final_snapshot``: fenced by the round the coordinator ended by
plan, ``planned_end``, and bounded like the agreement). A round that reaches no agreed boundary
within the hang bound (hang_factor x the step time, at least hang_floor_s) ends at once. A
loss (a member failed, left or was evicted) ends the round at once, as below.

Formation (formation.py). Forming a round must be given up as soon as the round ends, or
the worker misses the next round while the others wait for it there (and since its
heartbeat goes on, nothing ends that next round). Three steps, each abandonable or bounded:

- Arrival: every rank sets ``ARRIVED_KEY`` in the round store and waits for every rank's.
  The wait is held by the coordinator and refused with StaleRoundError the moment the round
  ends, so a rank whose peers never come leaves at once, before it has told anyone where
  to connect.
- Init: ``init_process_group`` through the round store, with gloo's timeout set to
  ``FORMATION_CONNECT_S`` (then raised to ``collective_timeout_s`` for the round's
  collectives). A round can end mid-init (a scale-up the instant a worker joins after the
  round closed, as at a fresh launch with ``last_call_s=0``). gloo writes each rank's address,
  then reads every rank's, then connects; the coordinator keeps an ended round's store
  readable, frozen, by its members (coordinator/state/roundstore.py, "Ended, read-only"),
  so either every rank wrote its address before the end and every rank connects in
  milliseconds (the gate below then sends them on), or one did not and every rank's read of
  its key is refused before anyone connects. Before that rule a rank whose read was refused
  gave up and left a peer that had read its address, and was the listening side of their
  pair, waiting in gloo's connect for about five times gloo's timeout (measured with torch
  2.13: 25 s for 5 s, 40 s for 8 s); at ``collective_timeout_s`` the recovery benchmark's
  workers sat there for minutes. The short timeout still bounds what the rule cannot help:
  a peer killed mid-init, or a coordinator member restored from a snapshot since the round
  ended (which does not keep the ended store).
  The in-memory snapshots' two gloo groups connect through the round store as well, so
  they are made in this step too (``MemorySnapshots.make_groups``), with the same connect
  timeout. Made after the gate, in ``attach``, a round that ended while they connected made
  the rank whose store read was refused give up and left a peer in gloo's connect for five
  times ``collective_timeout_s`` (or, when its connect went through, in the restore's
  synchronous collectives for ``collective_timeout_s``) while the next round waited for it:
  FSDP2 jobs scaling up 2 -> 3 -> 4 at start-up sat for minutes without training. Nothing
  of the formation after the gate uses the round store.
- Gate: one all-reduce, issued with ``async_op=True`` and waited for like the loop's
  collectives, before the restore. The restore's collectives are synchronous (object
  gathers, broadcasts, DCP's load), and a peer that saw the round end just after init skips
  them: without the gate this rank would wait in them for ``collective_timeout_s``. It
  carries every rank's vote on the pre-admission health check, run just before it
  (health.py): a rank without a check votes "healthy", so ranks that differ in it still
  run the same collectives.

Abandonable collectives (collectives.py). Collectives that the loop issues (``all_reduce``,
``all_reduce_gradients``) run with ``async_op=True``; the training thread waits on the
work's future in slices of ``WAIT_SLICE_S`` and gives up as soon as the round ended (a
round-change callback also wakes the waiter at once) or the collective deadline passed. A
SIGKILLed peer usually makes gloo fail its neighbours' collectives within milliseconds:
such a rank reports it to the coordinator at once (``ElasticRound._report_failure``), which
then confirms the dead peer's closed heartbeat stream without waiting out its window, so the
round ends, and its push releases the ranks whose collective did not fail, tens of
milliseconds after the kill (docs/elastic.md, "When a peer vanishes"). A SIGSTOPped peer
fails no collective, and there the coordinator's phi-accrual detector and its push end the
wait. An abandoned collective leaves the state as it was before the step: its gradients
are cleared (``p.grad = None``), so the ``optimizer.step()`` that follows changes nothing,
and ``step_done`` does not count the step.

Teardown (teardown.py). ``destroy_process_group`` does not wait for pending gloo work
(measured: it returns in microseconds with an all-reduce stuck on a stopped peer), but the
C++ process group's destructor would: it joins gloo's worker threads. So the loop moves the
group, its store, its checkpointer and its in-flight work from the round to the run's
``Abandoned`` and drops them as soon as nothing of theirs can be inside gloo (every work
completed, no checkpoint being written), or once the group's own timeout
(``collective_timeout_s``) has surely ended that work; the destructors run on a thread
("rallypoint-drop"), not on the way to the next round, whose peers wait for this rank.
Leak bound: one group (its gloo threads and sockets) per round abandoned in the last
``collective_timeout_s`` seconds with work still pending. The next group always bootstraps
in the next round's store namespace, so nothing of the old group can be mistaken for the
new one. Leaving the run (``__exit__``)
drops every group that is quiet, so a run that finished leaves none for the interpreter's
exit to destroy (its gloo threads and sockets torn down while the process ends, peers
closing theirs meanwhile); only a group with a collective still stuck on a peer stays, since
destroying it would block until that work times out. (``ProcessGroupGloo.abort()`` and
``shutdown()`` do not help: measured with torch 2.13, neither ends a pending work nor closes
the group, and a group shut down made its process abort at exit with "terminate called
without an active exception".)

Restore. At each formation every rank calls ``restore_state`` with what it holds: a worker
that trained in the previous round (and did not lose its participant) is a *survivor* at its
step. The same decision is made on every rank: KEEP (every rank is a survivor at one step),
BROADCAST from a survivor (replicated state, newcomers present, or survivors a step apart:
from the lowest-ranked at the highest step, restore_choice.py's ``choose_restore_source``
says why that is consistent; sent only to the ranks that lack it, directly when they are
few), MEMORY, DISK (the latest committed checkpoint, resharded by DCP to
this world size) or FRESH (nothing to restore: rank 0's replica is broadcast with its step
and sampler position, so every rank starts equal; a sharded model starts from ``build()``
at step 0, its sampler rewound). Every source restores the step and the sampler's position
with the parameters. ``restore="checkpoint"`` makes
every formation read the latest committed checkpoint when there is one (the classic
semantics: the state after a change is the last committed one). The sampler is
repartitioned for the new (rank, world size) and resumes at the restored global position.

Checkpoints. ``step_done(checkpoint_every=N)`` starts an asynchronous checkpoint every N
steps; a per-round commit thread commits it through the coordinator, fenced by the round, so
a zombie's commit is refused (commit.py has the protocol).

Progress. Every heartbeat carries this rank's progress, from which the leader names a rank
that hangs or straggles (progress.py).

Waiting. Joining (at ``with`` and when the worker joins again) waits for a coordinator that
no member of answers, or that has no leader, for ``connect_timeout_s`` (``join_timeout_s``
unless set), with a line in the log after each attempt ("waiting for the coordinator: no
member answered for 40 s; retrying ..."); a formed round is waited for ``join_timeout_s``.
Either running out ends the worker with one line saying what to check, not a traceback:
``CoordinatorUnreachableError`` (patience.py) and ``JoinTimeoutError`` (run.py), which a
program may catch.

Imports. A replacement's way in is mostly imports (docs/elastic.md, the section on a
replacement's way in), and much of what follows the model's build is waiting: on the
coordinator (connect, session, ``Join``, the round) and on the survivors (arrival). So this
package does not import the restore path (worker/checkpoint.py, worker/state_io.py, the
memory snapshots' code, and torch.distributed.checkpoint under them); ``ElasticRun.__enter__``
starts a thread that imports it (``run.RESTORE_PATH``) while the join waits, and the modules
that use it import it where they do (formation's restore, the first checkpoint, teardown), by
then loaded or being loaded (Python's import lock makes a second importer wait for the first).
Nor does it import FSDP or DTensor (half a second, sympy under them): a model holds FSDP2
modules or DTensors only once its maker imported them, so the loop looks for them without
importing them (fsdp_comm.py, ``lazy.any_dtensor``). tests/worker/test_lazy_imports.py keeps
the join path free of both.

Events. ``on_event(kind, fields)`` is called (from the training or the commit thread) for
each event :class:`ElasticRun` lists, with its fields in a dict; every event carries ``t``
(wall clock, seconds) and ``name`` (the worker's). A callable that cannot take those two
arguments is refused when the run is made, not at its first event.

The arguments, events and public members are listed in ``docs/api.md``, generated from the
docstrings of this package (``docs/generate.py``; a test keeps it fresh and checks every
argument and every event is described).

The modules, one job each:

- ``config.py``: :class:`ElasticConfig`, the run's settings (defaults from
  ``rallypoint.proto.v1.defaults``), and the event handler's check;
- ``state.py``: :class:`TrainState`, :class:`Formation` and what a round needs of its run;
- ``run.py``: :class:`ElasticRun`: joining, the rounds one after the other, joining again
  (worker/joining.py, shared with the torchrun backend), events;
- ``formation.py``: forming a round (arrival, init, gate, build, restore);
- ``round.py``: :class:`ElasticRound`, the user's loop's view of a round;
- ``collectives.py``: abandonable collectives, the gate;
- ``fsdp_comm.py``: FSDP2's collectives waited for the same way (a sharded model only);
- ``commit.py``: the checkpoint and snapshot commit protocol;
- ``progress.py``: the progress each heartbeat carries;
- ``health.py``: pre-admission health checks (the built-in collective probe);
- ``teardown.py``: leaving a round's group without blocking.
"""

from __future__ import annotations

from .collectives import CollectiveAbandoned
from .config import ElasticConfig, EventHandler, RestoreMode
from .health import CollectiveProbe, HealthCheck
from .round import ElasticRound
from .run import ElasticRun, JoinTimeoutError, RunArguments, elastic_training
from .state import Formation, TrainState

__all__ = [
    "CollectiveAbandoned",
    "CollectiveProbe",
    "ElasticConfig",
    "ElasticRound",
    "ElasticRun",
    "EventHandler",
    "Formation",
    "HealthCheck",
    "JoinTimeoutError",
    "RestoreMode",
    "RunArguments",
    "TrainState",
    "elastic_training",
]
