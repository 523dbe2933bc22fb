"""The peers benchmark runs end to end in its quick form (one short trial of plain DDP, of
torchft, of rallypoint and of rallypoint restarted by the warm launcher) and writes the
JSON shape `make bench-peers` promises, leaving no process running; and its bit-identical
check can fail: the checksum tells apart states that differ in one parameter bit or one
optimizer state value. Speed is not checked.

CI runs torchft at the 1 s heartbeat timeout only (the one the ratios are taken against);
``RALLYPOINT_SLOW=1`` (``make pytest-long``) adds torchft at its default. The two run the same
worker and bench code and differ in one lighthouse flag (``--heartbeat_timeout_ms``), and the
default's kill trial is the slowest of the four (a 5 s stall)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import assert_left_nothing, no_process_outlives

REPOSITORY = Path(__file__).resolve().parents[2]
# bench/ is a folder of scripts run from the repository (python -m bench.peers_bench), not an
# installed package: the test imports it the same way.
if str(REPOSITORY) not in sys.path:
    sys.path.insert(0, str(REPOSITORY))
SYSTEMS: tuple[str, ...] = (
    ("plain", "torchft_default", "torchft_hb1s", "rallypoint", "rallypoint_warm")
    if os.environ.get("RALLYPOINT_SLOW") == "1"
    else ("plain", "torchft_hb1s", "rallypoint", "rallypoint_warm")
)
COLD_FLOOR = "cold_floor"  # no system: a cold process's imports, model and one step alone


def test_checksum_tells_apart_states_that_differ_in_one_bit_or_in_optimizer_state() -> None:
    torch = pytest.importorskip("torch")
    from bench.peers_worker import make_model, state_checksum

    def trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        model = make_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.ones(2, 512)).sum().backward()
        optimizer.step()
        return model, optimizer

    model, optimizer = trained()
    twin, twin_optimizer = trained()
    assert state_checksum(model, optimizer) == state_checksum(twin, twin_optimizer)

    # One bit of one parameter.
    with torch.no_grad():
        weight = next(twin.parameters())
        weight.view(-1).view(torch.int32)[0] ^= 1
    assert state_checksum(model, optimizer) != state_checksum(twin, twin_optimizer)

    # Parameters equal, optimizer state not: the step counter (a 0-d tensor) and a moment.
    twin, twin_optimizer = trained()
    first = next(twin.parameters())
    twin_optimizer.state[first]["step"] += 1
    assert state_checksum(model, optimizer) != state_checksum(twin, twin_optimizer)
    twin, twin_optimizer = trained()
    twin_optimizer.state[next(twin.parameters())]["exp_avg_sq"].view(-1)[0] += 1.0
    assert state_checksum(model, optimizer) != state_checksum(twin, twin_optimizer)


class _Printed:
    """What the bench reads of a worker: the events it printed and when it was started."""

    def __init__(self, started_t: float, phases: dict[str, float]) -> None:
        self.started_t = started_t
        self.phases = [{"event": "phase", "phase": k, "t": t} for k, t in phases.items()]

    def of(self, kind: str) -> list[dict[str, object]]:
        return list(self.phases) if kind == "phase" else []


def test_each_rejoin_phase_is_the_time_since_the_one_before_and_they_add_up() -> None:
    from bench.peers_bench import REJOIN_PHASES, rejoin_phases

    # Printed out of order, and without connect/session (torchft has neither).
    printed = {"model": 104.0, "interpreter": 100.5, "torch": 102.0, "library": 103.0}
    printed |= {"restore": 104.9, "join": 104.2, "round": 104.5, "group": 104.6}
    phases = rejoin_phases(_Printed(100.0, printed), 105.0)  # type: ignore[arg-type]
    assert list(phases) == [p for p in REJOIN_PHASES if p not in ("connect", "session")]
    assert phases["interpreter"] == pytest.approx(0.5)
    assert phases["torch"] == pytest.approx(1.5)
    assert phases["join"] == pytest.approx(0.2)  # since model: connect/session are absent
    assert phases["first_step"] == pytest.approx(0.1)
    assert sum(phases.values()) == pytest.approx(5.0)


def _summarized_trial(system: str, rejoin_s: float, training_at_spawn: int) -> dict[str, Any]:
    parts = ("start_to_imported", "imported_to_joined", "joined_to_first_step")
    return {
        "system": system,
        "ok": True,
        "steady_step_s": 0.05,
        "bit_identical": True,
        "kill_stall_s": [0.1, 0.1, 0.1],
        "kill_first_gap_s": [0.1, 0.1, 0.1],
        "rejoin_first_step_s": rejoin_s,
        "rejoin_parts_s": dict.fromkeys(parts, rejoin_s / 3),
        "rejoin_phases_s": {"torch": 1.0},
        "rejoin_after_torch_s": rejoin_s - 1.0,
        "survivors_training_at_spawn": training_at_spawn,
        "steps_rolled_back": 0,
        "rejoin_in_sync": True,
    }


def test_rejoin_into_a_training_world_is_told_apart_from_one_still_stalled() -> None:
    """torchft's replacement that starts while its survivors still wait out gloo's timeout
    waits with them: the diagnostic ratio compares only rejoins into a world that trained
    again before the replacement started (all 3 survivors), on both sides."""
    from bench.peers_bench import diagnostic_ratios, ratios, summarize

    trials = [
        _summarized_trial("torchft_hb1s", 2.0, 3),
        _summarized_trial("torchft_hb1s", 3.1, 0),
        _summarized_trial("torchft_hb1s", 3.1, 2),
        _summarized_trial("rallypoint", 2.2, 3),
        _summarized_trial("rallypoint", 2.1, 3),
        _summarized_trial("rallypoint", 2.4, 1),
    ]
    top = summarize(trials)
    assert top["rejoin_into_training_s"]["torchft_hb1s"]["n"] == 1
    assert top["rejoin_into_training_s"]["rallypoint"]["median"] == pytest.approx(2.15)
    assert ratios(top)["rejoin_vs_torchft"] == pytest.approx(2.2 / 3.1)
    assert diagnostic_ratios(top)["rejoin_into_training_vs_torchft"] == pytest.approx(2.15 / 2.0)
    # No torchft trial drew a training world: no ratio, rather than a wrong one.
    top = summarize(
        [t for t in trials if t["survivors_training_at_spawn"] < 3 or t["system"] != "torchft_hb1s"]
    )
    assert diagnostic_ratios(top)["rejoin_into_training_vs_torchft"] is None
    # No warm trial: no warm ratio.
    assert diagnostic_ratios(top)["rejoin_warm_vs_torchft"] is None


def test_the_warm_restart_is_a_system_of_its_own_and_not_the_target() -> None:
    from bench.peers_bench import diagnostic_ratios, ratios, summarize

    top = summarize(
        [
            _summarized_trial("torchft_hb1s", 2.0, 3),
            _summarized_trial("rallypoint", 3.0, 3),
            _summarized_trial("rallypoint_warm", 0.5, 3),
            _summarized_trial("rallypoint_warm", 0.7, 3),
        ]
    )
    assert top["rejoin_first_step_s"]["rallypoint_warm"]["median"] == pytest.approx(0.6)
    # The target stays the cold replacement's; the warm one is a diagnostic beside it.
    assert ratios(top)["rejoin_vs_torchft"] == pytest.approx(3.0 / 2.0)
    assert diagnostic_ratios(top)["rejoin_warm_vs_torchft"] == pytest.approx(0.6 / 2.0)


def test_the_cold_floor_is_no_system_and_each_replacement_is_read_against_it() -> None:
    """The cold floor (one process's imports, model and a step alone) has a start to first
    step and phases, no kill or steady figures and no say in a target; each system's
    replacement is also given less the floor, and the floor against torchft's replacement
    (all its trials and those into a training world) says how much of 0.8 is left."""
    from bench.peers_bench import diagnostic_ratios, ratios, summarize

    floor = {
        "system": COLD_FLOOR,
        "ok": True,
        "steady_step_s": None,
        "bit_identical": None,
        "rejoin_first_step_s": 1.8,
        "rejoin_phases_s": {"torch": 0.9, "model": 0.85, "first_step": 0.05},
    }
    top = summarize(
        [
            floor,
            {**floor, "rejoin_first_step_s": 2.0},
            {**floor, "ok": False},  # a failed trial: counted, not measured
            _summarized_trial("torchft_hb1s", 2.4, 3),
            _summarized_trial("torchft_hb1s", 3.1, 0),
            _summarized_trial("rallypoint", 2.3, 3),
            _summarized_trial("rallypoint_warm", 0.3, 3),  # from a fork: not above any floor
        ]
    )
    assert top["trials_ok"][COLD_FLOOR] == "2/3"
    assert top["rejoin_first_step_s"][COLD_FLOOR]["median"] == pytest.approx(1.9)
    assert top["rejoin_phases_s"][COLD_FLOOR]["model"]["median"] == pytest.approx(0.85)
    for field in ("steady_step_s", "bit_identical", "kill_stall_s", "rejoin_in_sync"):
        assert COLD_FLOOR not in top[field], field
    assert top["rejoin_above_cold_floor_s"] == {
        "torchft_hb1s": pytest.approx(2.75 - 1.9),
        "rallypoint": pytest.approx(2.3 - 1.9),
    }
    found = diagnostic_ratios(top)
    assert found["cold_floor_vs_torchft"] == pytest.approx(1.9 / 2.75)
    assert found["cold_floor_vs_torchft_into_training"] == pytest.approx(1.9 / 2.4)
    assert ratios(top)["rejoin_vs_torchft"] == pytest.approx(2.3 / 2.75)  # unchanged by it
    # No floor measured: no floor figures, rather than wrong ones.
    top = summarize([_summarized_trial("torchft_hb1s", 2.4, 3)])
    assert top["rejoin_above_cold_floor_s"] == {}
    assert diagnostic_ratios(top)["cold_floor_vs_torchft"] is None
    assert diagnostic_ratios(top)["cold_floor_vs_torchft_into_training"] is None


def test_worker_notes_a_phase_once_and_changes_no_result() -> None:
    import io
    from contextlib import redirect_stdout

    from bench.peers_worker import Once, Proxy

    class Inner:
        seen = "inner attribute"

        def _quorum(self, value: int) -> int:
            return value + 1

    inner = Inner()
    proxy = Proxy(inner, _quorum=Once("round", inner._quorum))
    out = io.StringIO()
    with redirect_stdout(out):
        assert proxy._quorum(1) == 2
        assert proxy._quorum(5) == 6
    assert proxy.seen == "inner attribute"
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(e["event"], e["phase"]) for e in lines] == [("phase", "round")]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_replacement_starts_alone_on_its_cpu_and_shares_all_after() -> None:
    from bench.replacement_cpu import ReplacementCpu, allowed_cpus, process_tree

    every = os.sched_getaffinity(0)
    cpu = max(every)
    # What the bench has started by then, as a tree under one root (the bench stands in):
    # a survivor, and a coordinator that runs its members as children of its own.
    bench = subprocess.Popen(
        ["sh", "-c", "sleep 30 & sh -c 'sleep 30 & sleep 30 & wait' & wait"],
        start_new_session=True,
    )
    replacement = None
    try:
        wait = time.monotonic() + 10.0
        while len(process_tree(bench.pid)) < 5 and time.monotonic() < wait:
            time.sleep(0.01)
        stood_in = process_tree(bench.pid)
        assert len(stood_in) == 5, stood_in
        own = ReplacementCpu(cpu)
        own.before_start([bench.pid])
        for pid in stood_in:
            assert allowed_cpus(pid) == every - {cpu}, pid
        with own.starting():
            # The replacement's own view of its CPUs from its first instruction.
            replacement = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import os; print([sorted(os.sched_getaffinity(0)), os.nice(0)])",
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
        assert os.sched_getaffinity(0) == every - {cpu}  # the caller is off it again
        assert os.getpriority(os.PRIO_PROCESS, 0) == own.nice  # and at its own priority
        out, _ = replacement.communicate(timeout=30)
        # Ahead of ordinary processes on its CPU, where permitted (the record says which).
        boosted = own.placement()["replacement_nice"] is not None
        assert json.loads(out) == [[cpu], ReplacementCpu.NICE if boosted else own.nice]
        sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
        try:
            own.started(sleeper.pid)
            assert os.sched_getaffinity(sleeper.pid) == {cpu}
            if boosted:
                assert os.getpriority(os.PRIO_PROCESS, sleeper.pid) == ReplacementCpu.NICE
            autogroup = Path(f"/proc/{sleeper.pid}/autogroup")
            if own.placement()["replacement_autogroup_nice"] is not None:
                assert autogroup.read_text().split()[-1] == str(ReplacementCpu.NICE)
            own.release()
            assert own.released_t is not None
            assert os.sched_getaffinity(sleeper.pid) == every
            assert os.getpriority(os.PRIO_PROCESS, sleeper.pid) == own.nice
            if own.placement()["replacement_autogroup_nice"] is not None:
                assert autogroup.read_text().split()[-1] == "0"
            for pid in stood_in:
                assert allowed_cpus(pid) == every, pid
        finally:
            sleeper.kill()
            sleeper.wait()
        placement = own.placement()
        assert placement["replacement_cpu"] == cpu
        assert placement["sharing_replacement_cpu"] == []
        assert len(placement["moved_off"]) == 5
        assert placement["replacement_cpu_s"] >= 0 and placement["replacement_wait_s"] >= 0
        # Off: nobody is pinned.
        off = ReplacementCpu(None)
        off.before_start([bench.pid])
        assert all(allowed_cpus(pid) == every for pid in stood_in)
        assert off.placement() == {"replacement_cpu": None}
    finally:
        os.sched_setaffinity(0, every)
        os.killpg(bench.pid, signal.SIGKILL)
        bench.wait()


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(900)
def test_first_port_moves_every_port_of_the_run_into_its_block(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench.peers_bench import Ports, main

    ports = Ports(50700)  # the cluster takes 50700-50705
    taken = [port for _ in range(40) for port in ports.take(4)]
    assert min(taken) >= 50706 and max(taken) <= 50799, (min(taken), max(taken))
    with pytest.raises(SystemExit):
        main(["--first-port", "80", "--out", "/dev/null"])
    assert "--first-port 80: not in 1024-65436" in capsys.readouterr().err


def test_quick_run_writes_results_and_leaves_no_process(tmp_path: Path) -> None:
    pytest.importorskip("torchft")
    out = tmp_path / "peers.json"
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    with no_process_outlives("the peers benchmark"):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.peers_bench",
                "--quick",
                f"--systems={','.join((*SYSTEMS, COLD_FLOOR))}",
                f"--out={out}",
            ],
            cwd=REPOSITORY,
            env={**os.environ, "TMPDIR": str(scratch)},
            capture_output=True,
            text=True,
            timeout=880,
            check=False,
        )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == f"wrote {out} and {out.with_suffix('.png')}"
    assert_left_nothing(scratch, "the benchmark")
    report = json.loads(out.read_text())
    assert report["quick"] is True
    assert report["trials_ok"] == dict.fromkeys((*SYSTEMS, COLD_FLOOR), "1/1"), report["trials"]
    for system in SYSTEMS:
        assert report["steady_step_s"][system]["median"] > 0, system
        assert report["bit_identical"][system] is True, system
    for system in SYSTEMS[1:]:
        assert report["kill_stall_s"][system]["n"] == 3, system  # one per survivor
        assert report["rejoin_first_step_s"][system]["median"] > 0, system
        assert set(report["rejoin_parts_s"][system]) == {
            "start_to_imported",
            "imported_to_joined",
            "joined_to_first_step",
        }
        assert report["steps_rolled_back"][system]["n"] == 1, system
        # A replacement's way in, phase by phase, in the same run for both systems.
        (trial,) = [t for t in report["trials"] if t["system"] == system]
        phases = trial["rejoin_phases_s"]
        own = {"connect", "session"} if system.startswith("rallypoint") else set()
        common = {"interpreter", "torch", "library", "model", "join", "round", "group"}
        assert set(phases) == common | own | {"restore", "first_step"}, (system, phases)
        assert min(phases.values()) >= 0, (system, phases)
        assert sum(phases.values()) == pytest.approx(trial["rejoin_first_step_s"]), system
        assert 0 < trial["rejoin_after_torch_s"] < trial["rejoin_first_step_s"], system
        assert 0 <= trial["survivors_training_at_spawn"] <= 3, system
        # The replacement had a CPU of its own until it made its model, then shared again.
        if len(os.sched_getaffinity(0)) > 1:
            assert trial["replacement_cpu"] == max(os.sched_getaffinity(0)), system
            released = trial["replacement_cpu_released_after_s"]
            assert 0 < released < trial["rejoin_first_step_s"], system
            # Nothing else the bench started (survivors, members, lighthouse, itself) on it.
            placement = trial["replacement_placement"]
            assert placement["sharing_replacement_cpu"] == [], (system, placement)
            assert len(placement["moved_off"]) >= 4, (system, placement)
    assert set(report["diagnostic_ratios"]) == {
        "rejoin_after_torch_vs_torchft",
        "rejoin_into_training_vs_torchft",
        "rejoin_warm_vs_torchft",
        "cold_floor_vs_torchft",
        "cold_floor_vs_torchft_into_training",
    }
    # The cold floor: one process, started and placed as a replacement, its way to a step
    # alone cut into the same phases (no system's: no connect, join, round or restore).
    (floor,) = [t for t in report["trials"] if t["system"] == COLD_FLOOR]
    assert set(floor["rejoin_phases_s"]) == {"interpreter", "torch", "library", "model"} | {
        "first_step"
    }
    assert sum(floor["rejoin_phases_s"].values()) == pytest.approx(floor["rejoin_first_step_s"])
    if len(os.sched_getaffinity(0)) > 1:
        assert floor["replacement_placement"]["sharing_replacement_cpu"] == [], floor
    assert report["diagnostic_ratios"]["cold_floor_vs_torchft"] is not None
    assert set(report["rejoin_above_cold_floor_s"]) == set(SYSTEMS[1:]) - {"rallypoint_warm"}
    # The warm trial's replacement was the launcher's fork: timed from the fork it printed
    # (a trial whose replacement printed none fails: trials_ok above).
    assert report["diagnostic_ratios"]["rejoin_warm_vs_torchft"] is not None
    assert set(report["ratios"]) == {
        "overhead_vs_plain",
        "kill_stall_vs_torchft",
        "rejoin_vs_torchft",
    }
    for name, check in report["targets"].items():
        assert name.startswith("ratios[")
        assert isinstance(check["met"], bool) and check["value"] is not None, (name, check)
    for trial in report["trials"]:
        assert trial["cpu_count"] == os.cpu_count()
        assert {"load_1m", "load_5m", "load_15m"} <= set(trial["load_before"])
    assert "torchft_ddp_wrapper" in report["parameters"]
