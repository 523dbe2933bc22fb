"""Every Python block of README.md and of the pages in docs/ runs as written, against a real
cluster.

A block is a fenced ```` ```python ```` block starting at the margin (an indented one is part
of a list item, and is not picked out). The blocks read the cluster's endpoints from
``RALLYPOINT_ENDPOINTS`` (default: the local cluster of ``rallypoint cluster up``), which the
test sets to its own cluster's. A block that trains with ``elastic_training`` runs as
``min_nodes`` processes, as the README says to run it: the second one named as the README
says (``name="worker-2"``). Each block must exit 0; a training block must leave its job
finished.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint.client import JobState, SyncClient

from .harness import ProcessCluster, running_cluster

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def page_blocks() -> list[tuple[str, str]]:
    """(where, block) for every Python block of the README and the docs pages, in order;
    ``where`` is the page and the block's number in it, e.g. ``docs/elastic.md:1``."""
    return [
        (f"{page.relative_to(ROOT)}:{number}", block)
        for page in PAGES
        for number, block in enumerate(BLOCK.findall(page.read_text()), 1)
    ]


def python_blocks() -> list[str]:
    return [block for _, block in page_blocks()]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    with running_cluster(tmp_path_factory.mktemp("readme"), 3, tick_ms=50) as running:
        yield running


def test_the_pages_have_the_blocks_this_test_knows() -> None:
    blocks = page_blocks()
    assert len(BLOCK.findall(README.read_text())) >= 2
    # The docs pages' blocks are run too: the FSDP example, the API reference's.
    assert any(where.startswith("docs/") for where, _ in blocks)
    for where, block in blocks:
        compile(block, where, "exec")  # each one is a whole program
        assert "RALLYPOINT_ENDPOINTS" in block or "Client(" not in block, where


def calls_elastic_training(block: str) -> bool:
    """Whether the block trains (a comment that shows the call, as the FSDP example's does,
    is not training)."""
    return any(
        isinstance(node, ast.Call) and getattr(node.func, "id", None) == "elastic_training"
        for node in ast.walk(ast.parse(block))
    )


def run_copies(block: str, copies: int, cwd: Path, endpoints: list[str]) -> list[str]:
    """Run ``copies`` of the block in ``cwd`` at once; each one's standard output."""
    cwd.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RALLYPOINT_ENDPOINTS": ",".join(endpoints)}
    outputs = []
    procs = []
    for copy in range(1, copies + 1):
        program = cwd / f"block-{copy}.py"
        program.write_text(block.replace('name="worker-1"', f'name="worker-{copy}"'))
        procs.append(
            subprocess.Popen(
                [sys.executable, str(program)],
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        for copy, proc in enumerate(procs, 1):
            out, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, f"copy {copy} exited {proc.returncode}:\n{out}\n{err}"
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return outputs


@pytest.mark.parametrize("number", range(len(page_blocks())), ids=[w for w, _ in page_blocks()])
def test_a_python_block_runs_as_written(
    cluster: ProcessCluster, tmp_path: Path, number: int
) -> None:
    block = python_blocks()[number]
    training = calls_elastic_training(block)
    copies = 1
    if training:
        found = re.search(r"min_nodes=(\d+)", block)
        assert found is not None, "a training block names its min_nodes"
        copies = int(found.group(1))
        assert 'name="worker-1"' in block
    run_copies(block, copies, tmp_path, cluster.endpoints)
    if training:
        job = re.search(r'job="([^"]+)"', block)
        assert job is not None
        with SyncClient(cluster.endpoints, timeout_s=20) as client:
            info = client.get_job(job.group(1)).round
        assert info.job_state is JobState.FINISHED, info


def test_the_training_example_runs_twice_from_two_directories(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    """The README's example hard-codes its job id: running it again is a new run
    (docs/elastic.md, "Running a job again"), from any directory. It once restored the first
    run's last checkpoint by a path relative to the first run's directory (every worker
    crashed), or, from the same directory, finished at once without training."""
    block = next(b for b in python_blocks() if 'job="demo"' in b and "max_steps=300" in b)
    for run in ("first", "second"):
        outputs = run_copies(block, 2, tmp_path / run, cluster.endpoints)
        for output in outputs:
            # Each worker's first round starts the run at step 0 (a restored run: 300).
            first = next(line for line in output.splitlines() if line.startswith("round_formed"))
            assert "'step': 0," in first, output
        # And trains: a restored step 300 would print no step 100.
        assert any("step 100 of round" in output for output in outputs), outputs
        with SyncClient(cluster.endpoints, timeout_s=20) as client:
            status = client.get_job("demo")
        assert status.round.job_state is JobState.FINISHED, status.round
    # The second run's checkpoints are its own, named absolutely (they mean the same from
    # any directory, for a run that resumes from them).
    assert status.latest_checkpoint is not None
    assert Path(status.latest_checkpoint.uri).is_relative_to(tmp_path / "second")
