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

# How far each source was checked: "excerpt" means the figure was read in a quoted excerpt of
# the source or of a report on it (``read_at`` names where); "recalled" means it is the source's
# figure as remembered, not re-read (check before quoting it elsewhere).
SOURCES: dict[str, dict[str, str]] = {
    "llama3": {
        "title": "The Llama 3 Herd of Models",
        "authors": "Llama Team, AI @ Meta",
        "year": "2024",
        "where": "arXiv:2407.21783",
        "checked": "excerpt: section 3.3.4 (466 interruptions in 54 days, 47 planned, 419 "
        "unexpected; Faulty GPU 148 (30.1%), GPU HBM3 Memory 72 (17.2%), GPU SRAM Memory 19 "
        "(4.5%), GPU System Processor 17 (4.1%), Network Switch/Cable 35 (8.4%), CPU 2; 'more "
        "than 90% effective training time'; manual intervention three times) as quoted by "
        "dcd_llama3; section 3.3.1 (8 GPUs per server; a 24K-GPU cluster, up to 16K used; "
        "Tectonic 240 PB, 2 TB/s sustained, 7 TB/s peak; checkpoints of 1 MB to 4 GB per GPU) "
        "as summarised by llama3_summary. Recalled, not re-read: the other rows of the "
        "root-cause table, and Table 4 (16M tokens per step, 400 TFLOPs per GPU, TP 8 x PP 16 "
        "x DP 128 at 16,384 GPUs)",
    },
    "dcd_llama3": {
        "title": "Meta report details hundreds of GPU and HBM3 related interruptions to Llama 3 "
        "training run",
        "authors": "DatacenterDynamics",
        "year": "2024",
        "where": "datacenterdynamics.com/en/news/meta-report-details-hundreds-of-gpu-and-hbm3-"
        "related-interruptions-to-llama-3-training-run: the root-cause table's largest rows and "
        "the >90% effective training time, quoted from llama3",
        "checked": "excerpt",
    },
    "llama3_summary": {
        "title": "The Llama 3 Herd of Models (paper notes: compute setup)",
        "authors": "ai-papers.xuzou.cn",
        "year": "2025",
        "where": "ai-papers.xuzou.cn/papers/llama3_2024: llama3 section 3.3.1's cluster, storage "
        "and checkpoint figures",
        "checked": "excerpt",
    },
    "zero": {
        "title": "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
        "authors": "Rajbhandari, Rasley, Ruwase, He",
        "year": "2020",
        "where": "SC 2020, section 3.1 (mixed-precision Adam: 2 + 2 + 12 bytes per parameter)",
        "checked": "excerpt of a report (nn.labml.ai's annotated ZeRO-DP: '(2 + 2 + K) psi ... "
        "K = 12 for Adam optimizer because it maintains a copy of parameters, and two moments "
        "per parameter in fp32'); the paper itself recalled",
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
    "pytorch_110947": {
        "title": "Change ProcessGroupNCCL default timeout to 10 min",
        "authors": "pytorch/pytorch pull request #110947",
        "year": "2023",
        "where": "github.com/pytorch/pytorch/pull/110947: the NCCL process group's default "
        "timeout lowered from 30 to 10 minutes (other backends keep 30), 'motivated by trying "
        "to save cluster time when encountering collective hangs'",
        "checked": "excerpt",
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
        "where": "github.com/NVIDIA/nccl/pull/1789: ncclBuildRing and initTransportsRank are "
        "O(N^2), 'often several dozens of seconds at 100K scale'; the fix saves 26 s of CPU in "
        "ncclBuildRing at 96K ranks and 11+ s in initTransportsRank at 48K; savings at those "
        "sizes, not a total at 16K: context for pg_init_s, not used as a value",
        "checked": "excerpt",
    },
    "byterobust": {
        "title": "Robust LLM Training Infrastructure at ByteDance",
        "authors": "Wan, Liu et al. (HKU, ByteDance Seed)",
        "year": "2025",
        "where": "arXiv:2509.16293 (SOSP 2025), abstract: 97% ETTR for a three-month training "
        "job on 9,600 GPUs, measured in production; a cross-check, not an input",
        "checked": "excerpt (abstract)",
    },
    "l4": {
        "title": "L4: Diagnosing Large-scale LLM Training Failures via Automated Log Analysis",
        "authors": "Jiang et al. (CUHK, Huawei Cloud)",
        "year": "2025",
        "where": "arXiv:2503.20263 (FSE 2025): 428 LLM training failures on a production "
        "platform; hardware and user faults predominate. It classes failures by symptom "
        "(launch failure, training crash, abnormal behaviour), not by how many processes a "
        "software fault takes down: context for job_wide_software_fraction, not used as a value",
        "checked": "excerpt (abstract)",
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


HOST_MEMORY_NOTE = (
    "the restore after a crash of every rank from the snapshots they kept in host memory "
    "(snapshot_dir): 3 ranks keep an FSDP2 state of ~200 MB in files, all exit as a crash "
    "would, and 3 new processes (ranks rotated) take the files up and restore from them; the "
    "state over that first restore, taking the files up included (bench/memory_ranks.py, "
    "restart phase; loopback TCP between processes, 2 cores)"
)
# Measured on this machine before bench/results/recovery.json held the figure (the restart
# phase of ``python -m bench.recovery_bench``'s memory figures, run beside the restore from
# peers' memory it is compared with): host-memory restore / peers'-memory restore.
HOST_MEMORY_VS_PROCESS_MEMORY = 0.93
HOST_MEMORY_MEASURED = (
    "2026-12-06 in 4 runs at load 4-10 (first restore 0.24-0.54 s, median 0.27 s, for 201.5 "
    "MB; ratios 0.38-1.46, median 0.93)"
)


def host_memory_restore() -> Input:
    """The restore from host memory after a crash of every rank: recovery.json's
    host_memory_restore_bytes_per_s once it holds it (``make bench-recovery``); until then
    its restore from peers' memory (the same load over the same servers) times the ratio
    measured beside it (HOST_MEMORY_VS_PROCESS_MEMORY)."""
    try:
        value, ref = read_measured("recovery.json", "host_memory_restore_bytes_per_s")
        return Input(value, "bytes/s", "measured", ref, HOST_MEMORY_NOTE)
    except SystemExit:
        path = "details.memory.figures.memory_restore_bytes_per_s"
        value, ref = read_measured("recovery.json", path)
    return Input(
        value * HOST_MEMORY_VS_PROCESS_MEMORY,
        "bytes/s",
        "derived",
        f"{ref} x {HOST_MEMORY_VS_PROCESS_MEMORY:g}",
        f"{HOST_MEMORY_NOTE}: measured {HOST_MEMORY_MEASURED} at "
        f"{HOST_MEMORY_VS_PROCESS_MEMORY:.2f}x the restore from peers' memory of the same run; "
        "recovery.json does not hold it yet (make bench-recovery records it as "
        "host_memory_restore_bytes_per_s, read instead from then on)",
    )


def build_inputs() -> dict[str, Input]:
    """Every input of the model, by name (measured ones read from bench/results now)."""
    from rallypoint.proto.v1.defaults import JOB_CONFIG

    def measured(name: str, path: str, unit: str, note: str = "") -> Input:
        value, ref = read_measured(name, path)
        return Input(value, unit, "measured", ref, note)

    def step_overhead(system: str, note: str = "") -> Input:
        # A difference of two measured medians, floored at 0: a system measured faster than
        # plain DDP on this noisy machine is not credited with a gain.
        steady, _ = read_measured("peers.json", f"steady_step_s.{system}.median")
        plain, _ = read_measured("peers.json", "steady_step_s.plain.median")
        ref = f"bench/results/peers.json: steady_step_s.{system}.median - "
        ref += "steady_step_s.plain.median, floored at 0"
        figures = f"{steady * 1000:.1f} ms against plain DDP's {plain * 1000:.1f} ms"
        return Input(
            max(0.0, steady - plain), "s", "derived", ref, figures + (f"; {note}" if note else "")
        )

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
            "assumption: llama3 counts 54 software-bug and 2 dependency interruptions but does "
            "not say whether each crashed one process or every process; no public fault study "
            "found splits software faults by how many processes they take down (l4 classes its "
            "428 failures by symptom). 0.5 says nothing is known either way. It matters: a "
            "job-wide fault leaves no memory to restore from, so it costs every system a restart "
            "from the disk checkpoint",
        ),
        "planned_drainable_fraction": Input(
            0.5,
            "share",
            "assumption",
            "assumption: llama3 section 3.3.4 names the 47 planned interruptions' kinds "
            "(firmware upgrades; configuration or dataset updates) without counts; 0.5 splits "
            "them evenly between host drains and whole-job stops",
        ),
        "hosts_per_network_fault": Input(
            1.0,
            "hosts",
            "assumption",
            "assumption: llama3 does not say how many hosts a switch or cable fault cut off; "
            "1 (a host's link) is the smallest; a leaf switch would cut off every host under it",
        ),
        # ------------------------------------------------------------ costs that grow with scale
        "pg_init_s": Input(
            30.0,
            "s",
            "assumption",
            "assumption: no published total for creating the NCCL process groups of 16,384 ranks "
            "(world, TP, PP, DP) was found. nccl_1789 saved 26 s in one O(N^2) loop at 96K ranks "
            "and 11+ s in another at 48K; scaled by (16/96)^2 that loop is ~0.7 s at 16K, but "
            "bootstrap and connection setup are not in it. 30 s is a round guess of the order, "
            "paid on every re-formation by rallypoint and on every restart by all three",
        ),
        "job_relaunch_s": Input(
            60.0,
            "s",
            "assumption",
            "assumption: stopping and relaunching 2,048 hosts' processes and their launcher "
            "rendezvous; no published figure at 16K found (ft_hsdp reports a 10 min synchronous "
            "recovery stall at O(100K) GPUs, the whole restart, not this part)",
        ),
        "process_start_s": Input(
            60.0,
            "s",
            "assumption",
            "assumption: a fresh training process at this size (interpreter, imports, CUDA "
            "context, building its model shard); no published figure found",
        ),
        "nccl_timeout_s": Input(
            600.0,
            "s",
            "published",
            "pytorch_110947",
            "a hung collective is found by the NCCL watchdog's timeout: 10 minutes, the NCCL "
            "process group's default since this change",
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
        "host_memory_restore_bytes_per_s": host_memory_restore(),
        "replica_restore_bytes_per_s": measured(
            "replicas.json",
            "replica_restore_bytes_per_s",
            "bytes/s",
            "a newcomer's shards received from the survivors' replicas, point to point over "
            "gloo on loopback (dp=2 x tp=2, ~100 MB per rank, 2 loaded cores; source replicas, "
            "steps_rolled_back 0 in the same file)",
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
        "rallypoint_step_overhead_s": step_overhead("rallypoint"),
        "torchft_step_overhead_s": step_overhead(
            "torchft_default",
            "the per-step quorum and commit (assumption: the same at 128 replica groups)",
        ),
        "torchft_kill_stall_s": measured(
            "peers.json",
            "kill_stall_s.torchft_default.median",
            "s",
            "survivors' stall after a SIGKILL, torchft at its defaults (a survivor blocked in "
            "gloo waits out its 5 s timeout); kill_stall_s.torchft_hb1s is the 1 s heartbeat's",
        ),
        "torchft_rejoin_s": measured(
            "peers.json",
            "rejoin_first_step_s.torchft_default.median",
            "s",
            "a replacement from process start to its first step in sync, torchft's defaults",
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
