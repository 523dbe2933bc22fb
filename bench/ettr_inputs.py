"""The inputs of the effective-training-time model, each with where it came from: a published
source (by id in ``SOURCES``, with section or table), a figure this repository measured (the
results file and the field it was read from), a derivation from other inputs, a setting (a default
of this repository, or the comparison's choice), or an assumption (no source known: named as
such). Every input, whatever its kind, is halved and doubled in the sensitivity table.

Measured figures are read from ``bench/results/*.json`` when the model runs, so the model
follows the latest committed runs; a missing file or field stops it with the make target that
produces it.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.ettr_model import Cause, Scope, count_key

RESULTS = Path(__file__).resolve().parent / "results"

# How far each source was checked in the session that wrote this model: "excerpt" means the
# figure was read in a quoted excerpt of the source or of a report on it; "recalled" means it
# is the source's figure as remembered, not re-read (check before quoting it elsewhere).
SOURCES: dict[str, dict[str, str]] = {
    "llama3": {
        "title": "The Llama 3 Herd of Models",
        "authors": "Llama Team, AI @ Meta",
        "year": "2024",
        "where": "arXiv:2407.21783",
        "checked": "excerpt (section 3.3.4 counts and shares, section 3.3.1 storage and "
        "checkpoint sizes); recalled (Table 4)",
    },
    "zero": {
        "title": "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
        "authors": "Rajbhandari, Rasley, Ruwase, He",
        "year": "2020",
        "where": "SC 2020, section 3.1 (mixed-precision Adam: 2 + 2 + 12 bytes per parameter)",
        "checked": "recalled",
    },
    "kaplan": {
        "title": "Scaling Laws for Neural Language Models",
        "authors": "Kaplan et al.",
        "year": "2020",
        "where": "arXiv:2001.08361, section 2.1 (training compute C ~ 6N per token)",
        "checked": "recalled",
    },
    "young": {
        "title": "A first order approximation to the optimum checkpoint interval",
        "authors": "J. W. Young",
        "year": "1974",
        "where": "Communications of the ACM 17(9): interval = sqrt(2 x cost x MTBF)",
        "checked": "excerpt",
    },
    "kokolis": {
        "title": "Revisiting Reliability in Large-Scale Machine Learning Research Clusters",
        "authors": "Kokolis, Kuchnik et al. (FAIR at Meta)",
        "year": "2024",
        "where": "arXiv:2410.21680 (HPCA 2025): the ETTR metric this model reports",
        "checked": "excerpt (abstract)",
    },
    "torch_docs": {
        "title": "torch.distributed.init_process_group (PyTorch documentation)",
        "authors": "PyTorch",
        "year": "2024",
        "where": "parameter timeout: default 10 minutes for NCCL",
        "checked": "recalled",
    },
    "torchft_docs": {
        "title": "torchft documentation: Assumptions and Recommendations; Coordination",
        "authors": "PyTorch (Meta)",
        "year": "2025",
        "where": "docs.pytorch.org/torchft: replica groups, a lighthouse quorum of the healthy "
        "replicas, a Manager per replica group that heals a replica behind from a peer",
        "checked": "excerpt",
    },
    "ft_hsdp": {
        "title": "Training LLMs with Fault Tolerant HSDP on 100,000 GPUs",
        "authors": "Salpekar et al. (Meta)",
        "year": "2026",
        "where": "arXiv:2602.00277, abstract: failure-recovery stall 10 min (synchronous) and "
        "3 min (FT-HSDP) at O(100K) GPUs; context for assumptions, not used as a value",
        "checked": "excerpt (abstract)",
    },
    "nccl_1789": {
        "title": "NCCL Fast Init - CPU Optimizations for NCCL Initialization Large Scale",
        "authors": "NVIDIA/nccl pull request #1789 (Meta)",
        "year": "2025",
        "where": "ncclBuildRing and initTransportsRank: 'several dozens of seconds at 100K "
        "scale'; context for pg_init_s, not used as a value",
        "checked": "excerpt",
    },
    "issue37": {
        "title": "rallypoint issue 37: torchft in the same run (table measured on this machine)",
        "authors": "this repository",
        "year": "2026",
        "where": "issues show 37: 1.3 M-parameter MLP, 4 gloo processes; torchft 0.2.0 vs "
        "rallypoint vs plain DDP (bench/results/peers.json not committed yet)",
        "checked": "read",
    },
}


@dataclass(frozen=True, slots=True)
class Input:
    """One number the model uses. ``kind`` is published, measured, derived, setting (a
    default of this repository or the comparison's choice) or assumption; ``ref`` a SOURCES
    id (published), a results file and field (measured), the inputs it is computed from
    (derived), where the setting lives, or why this value (assumption)."""

    value: float
    unit: str
    kind: str
    ref: str
    note: str = ""

    def record(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "unit": self.unit,
            "source": {
                "kind": self.kind,
                "ref": self.ref,
                **({"note": self.note} if self.note else {}),
            },
        }


# Llama 3, section 3.3.4, the root-cause table of the 419 unexpected interruptions of a 54-day
# snapshot of 405B pre-training. Counts and shares as printed; the counts sum to 419. One row
# disagrees with itself: "Faulty GPU, 148, 30.1%" (148/419 is 35.3%); the model uses counts.
_HOST = "a hardware fault on a host: the host leaves the job until repaired (assumption: the "
_HOST += "paper does not say how each was handled; ~78% of unexpected interruptions were "
_HOST += "confirmed or suspected hardware, section 3.3.4)"
CAUSES: tuple[Cause, ...] = (
    Cause("Faulty GPU", "GPU", 148, 30.1, Scope.HOST, _HOST),
    Cause("GPU HBM3 Memory", "GPU", 72, 17.2, Scope.HOST, _HOST),
    Cause(
        "Software Bug",
        "Dependency",
        54,
        12.9,
        Scope.SOFTWARE,
        "assumption: a crash of one process, or of every process in the share "
        "job_wide_software_fraction",
    ),
    Cause(
        "Network Switch/Cable",
        "Network",
        35,
        8.4,
        Scope.NETWORK,
        "assumption: hosts_per_network_fault hosts lose their link",
    ),
    Cause(
        "Host Maintenance",
        "Unplanned Maintenance",
        32,
        7.6,
        Scope.HOST,
        "unplanned maintenance of a host: it leaves the job",
    ),
    Cause("GPU SRAM Memory", "GPU", 19, 4.5, Scope.HOST, _HOST),
    Cause("GPU System Processor", "GPU", 17, 4.1, Scope.HOST, _HOST),
    Cause("NIC", "Host", 7, 1.7, Scope.HOST, _HOST),
    Cause(
        "NCCL Watchdog Timeouts",
        "Unknown",
        7,
        1.7,
        Scope.HANG,
        "a collective stopped making progress: a hang, detected by a timeout",
    ),
    Cause("Silent Data Corruption", "GPU", 6, 1.4, Scope.HOST, _HOST),
    Cause("GPU Thermal Interface + Sensor", "GPU", 6, 1.4, Scope.HOST, _HOST),
    Cause("SSD", "Host", 3, 0.7, Scope.HOST, _HOST),
    Cause("Power Supply", "Host", 3, 0.7, Scope.HOST, _HOST),
    Cause("Server Chassis", "Host", 2, 0.5, Scope.HOST, _HOST),
    Cause("IO Expansion Board", "Host", 2, 0.5, Scope.HOST, _HOST),
    Cause("Dependency", "Dependency", 2, 0.5, Scope.SOFTWARE, "assumption: as Software Bug"),
    Cause("CPU", "Host", 2, 0.5, Scope.HOST, _HOST),
    Cause("System Memory", "Host", 2, 0.5, Scope.HOST, _HOST),
    # Section 3.3.4's text, not the table: 47 of the 466 interruptions were planned
    # ("automated maintenance operations such as firmware upgrades or operator-initiated
    # operations like configuration or dataset updates").
    Cause(
        "Planned (maintenance, configuration, dataset updates)",
        "Planned",
        47,
        10.1,
        Scope.PLANNED,
        "section 3.3.4 text; assumption: the share planned_drainable_fraction are host "
        "drains (firmware), the rest stop the whole job (configuration, dataset)",
    ),
)


def read_measured(name: str, path: str) -> tuple[float, str]:
    """The figure at ``path`` (dot-separated keys) in bench/results/``name``, and where it
    came from; a clear error naming the make target when it is not there."""
    target = f"make bench-{name.split('.')[0]}"
    file = RESULTS / name
    try:
        node: Any = json.loads(file.read_text())
    except OSError as exc:
        raise SystemExit(f"bench/results/{name} is missing ({exc.strerror}): run {target}") from exc
    for key in path.split("."):
        if not isinstance(node, dict) or node.get(key) is None:
            raise SystemExit(f"bench/results/{name} has no {path}: run {target} again")
        node = node[key]
    return float(node), f"bench/results/{name}: {path}"


def interpolate_loglog(points: dict[float, float], at: float) -> float:
    """Log-log interpolation (or extrapolation from the last two) of measured points."""
    sizes = sorted(points)
    lower, upper = sizes[-2], sizes[-1]
    for low, high in itertools.pairwise(sizes):
        if low <= at <= high:
            lower, upper = low, high
            break
    slope = math.log(points[upper] / points[lower]) / math.log(upper / lower)
    return float(points[lower] * (at / lower) ** slope)


def build_inputs() -> dict[str, Input]:
    """Every input of the model, by name (measured ones read from bench/results now)."""
    from rallypoint.proto.v1.defaults import JOB_CONFIG

    def measured(name: str, path: str, unit: str, note: str = "") -> Input:
        value, ref = read_measured(name, path)
        return Input(value, unit, "measured", ref, note)

    gpus = 16_384.0
    tokens_per_step = 16.0 * 2**20
    step_s = 6.0 * 405e9 * tokens_per_step / (gpus * 400e12)
    checkpoint_bytes = 405e9 * 14.0
    scale = json.loads((RESULTS / "scale.json").read_text())
    round_close = {float(size): value for size, value in scale["round_close_s"].items() if value}
    inputs: dict[str, Input] = {
        # ------------------------------------------------------------ the job
        "gpus": Input(
            gpus,
            "GPUs",
            "published",
            "llama3",
            "section 3.3: 405B pre-training on 16,384 H100 GPUs",
        ),
        "gpus_per_host": Input(
            8.0, "GPUs", "published", "llama3", "section 3.3.1: 8 GPUs per Grand Teton server"
        ),
        "days": Input(54.0, "days", "published", "llama3", "section 3.3.4: the 54-day snapshot"),
        "window_days": Input(
            54.0,
            "days",
            "published",
            "llama3",
            "section 3.3.4: the window the interruption counts cover",
        ),
        "step_s": Input(
            step_s,
            "s",
            "derived",
            "llama3, kaplan",
            "6 x 405e9 parameters x 16M tokens per step (Table 4) / (16,384 GPUs x "
            "400 TFLOPs per GPU (Table 4))",
        ),
        "replica_group_gpus": Input(
            128.0,
            "GPUs",
            "published",
            "llama3",
            "Table 4 at 16,384 GPUs: TP 8 x PP 16 = one data-parallel "
            "replica (DP 128); torchft's unit of failure",
        ),
        "checkpoint_bytes": Input(
            checkpoint_bytes,
            "bytes",
            "derived",
            "zero, llama3",
            "405e9 parameters x 14 bytes (bf16 weights + fp32 master "
            "weights and Adam moments; ZeRO's 16 less the gradients)",
        ),
        "state_bytes_per_gpu": Input(
            4e9,
            "bytes",
            "published",
            "llama3",
            "section 3.3.1: checkpoints save 1 MB to 4 GB per GPU; "
            "the upper end, as the rank a recovery waits for",
        ),
        "storage_bytes_per_s": Input(
            2e12,
            "bytes/s",
            "published",
            "llama3",
            "section 3.3.1: Tectonic, 2 TB/s sustained (7 TB/s peak)",
        ),
        "disk_checkpoint_interval_s": Input(
            1800.0,
            "s",
            "setting",
            "issue 37's comparison: a disk checkpoint every 30 minutes of training (all three "
            "systems keep it: a job-wide fault has no memory to restore from)",
        ),
        # ------------------------------------------------------------ interruptions
        "interruption_rate_multiplier": Input(
            1.0,
            "x",
            "published",
            "llama3",
            "section 3.3.4: 466 interruptions in 54 days (47 planned, 419 unexpected) at 1.0",
        ),
        "job_wide_software_fraction": Input(
            0.5,
            "share",
            "assumption",
            "no source says how many software faults kill "
            "every process (no in-process recovery for them)",
        ),
        "planned_drainable_fraction": Input(
            0.5,
            "share",
            "assumption",
            "no source splits the 47 planned interruptions into host drains and whole-job stops",
        ),
        "hosts_per_network_fault": Input(
            1.0,
            "hosts",
            "assumption",
            "no source says how many hosts a switch or cable fault took out",
        ),
        # ------------------------------------------------------------ costs that grow with scale
        "pg_init_s": Input(
            30.0,
            "s",
            "assumption",
            "creating the NCCL process groups of 16,384 ranks (no published "
            "figure at 16k found; nccl_1789 reports dozens of seconds at 100k "
            "before its fix)",
        ),
        "job_relaunch_s": Input(
            60.0,
            "s",
            "assumption",
            "stopping and relaunching 2,048 hosts' processes and their "
            "launcher rendezvous (ft_hsdp reports a 10 min synchronous "
            "recovery stall at 100k GPUs)",
        ),
        "process_start_s": Input(
            60.0,
            "s",
            "assumption",
            "a fresh training process at this size: interpreter, imports, "
            "CUDA context, building its model shard",
        ),
        "nccl_timeout_s": Input(
            600.0,
            "s",
            "published",
            "torch_docs",
            "a hung collective is found by the NCCL watchdog's timeout",
        ),
        # ------------------------------------------------------------ measured here
        "torchrun_restart_s": measured(
            "recovery.json",
            "torchrun_tuned_s",
            "s",
            "SIGKILL to training again, tuned c10d, 4 workers",
        ),
        "rallypoint_restart_s": measured(
            "torchrun.json",
            "backends.rallypoint.running_s",
            "s",
            "torchrun restart of every worker with --rdzv-backend=rallypoint, kill to running",
        ),
        "rallypoint_memory_recovery_s": measured(
            "recovery.json",
            "memory_recovery_s",
            "s",
            "SIGKILL of an FSDP2 worker to every survivor training, restored from memory",
        ),
        "detect_sigkill_s": measured(
            "scale.json", "detect_sigkill_s", "s", "among 10,000 participants"
        ),
        "detect_silent_s": measured(
            "scale.json",
            "detect_silent_s",
            "s",
            "a participant gone silent (a host lost), among 10,000",
        ),
        "round_close_s": Input(
            interpolate_loglog(round_close, gpus),
            "s",
            "derived",
            "bench/results/scale.json: round_close_s",
            "log-log between the measured 10,000 and 100,000 participants, at 16,384",
        ),
        "memory_restore_bytes_per_s": measured(
            "recovery.json",
            "details.memory.figures.memory_restore_bytes_per_s",
            "bytes/s",
            "a rank's state fetched from peers' memory over loopback TCP (2 cores)",
        ),
        "snapshot_blocked_s_per_gb": measured(
            "recovery.json",
            "snapshot_blocked_s_per_gb",
            "s/GB",
            "training held per memory snapshot",
        ),
        "hang_recovery_s": measured(
            "recovery.json", "hang_recovery_s", "s", "round ended to the others training"
        ),
        "hang_factor": Input(
            JOB_CONFIG.hang_factor,
            "x step",
            "setting",
            "proto/v1/defaults.py: JOB_CONFIG.hang_factor",
            "the default a hang verdict waits, in median steps",
        ),
        "hang_floor_s": Input(
            JOB_CONFIG.hang_floor_ms / 1000.0,
            "s",
            "setting",
            "proto/v1/defaults.py: JOB_CONFIG.hang_floor_ms",
        ),
        "rallypoint_step_overhead_s": Input(
            0.0,
            "s",
            "measured",
            "issue37",
            "steady step 35.9 ms against plain DDP's 37.8 ms: no cost measured",
        ),
        "torchft_step_overhead_s": Input(
            0.0505 - 0.0378,
            "s",
            "measured",
            "issue37",
            "steady step 50.5 ms against plain DDP's 37.8 ms: the "
            "per-step quorum and commit (assumption: the same at "
            "128 replica groups)",
        ),
        "torchft_kill_stall_s": Input(
            5.0, "s", "measured", "issue37", "survivors' stall after a SIGKILL, torchft's defaults"
        ),
        "torchft_rejoin_s": Input(
            3.12,
            "s",
            "measured",
            "issue37",
            "a replacement from process start to its first step in sync",
        ),
    }
    for cause in CAUSES:
        inputs[count_key(cause)] = Input(
            float(cause.count),
            "interruptions",
            "published",
            "llama3",
            f"section 3.3.4 and its root-cause table: {cause.name}, {cause.count} "
            f"({cause.share_pct}% as printed)",
        )
    return inputs
