"""The transport benchmark runs its four probes in fresh processes and writes the JSON
`make bench-transport` promises; bad arguments get one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.harness import no_process_outlives

REPOSITORY = Path(__file__).resolve().parents[2]


def run_bench(*arguments: str) -> subprocess.CompletedProcess[str]:
    with no_process_outlives("the transport benchmark"):
        return subprocess.run(
            [sys.executable, "-m", "bench.transport_bench", *arguments],
            cwd=REPOSITORY,
            capture_output=True,
            text=True,
            timeout=100,
            check=False,
        )


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_smoke_run_measures_every_probe(tmp_path: Path) -> None:
    out = tmp_path / "transport.json"
    done = run_bench("--smoke", "--no-plot", f"--out={out}")
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(out.read_text())

    assert document["benchmark"] == "transport"
    assert {"python", "grpcio", "uvloop"} <= set(document["versions"])
    assert document["parameters"]["messages"] == 200
    assert set(document["results"]) == {
        "grpc_unary",
        "grpc_stream",
        "tcp_stream",
        "peer_stream",
    }
    for name, summary in document["results"].items():
        assert 0 < summary["p50_us"] <= summary["p99_us"], name
        assert summary["cpu_per_message_us"] > 0, name
        assert len(summary["trials"]) == 1, name
    unary = document["results"]["grpc_unary"]
    assert unary["client_cpu_per_call_us"] > 0 and unary["server_cpu_per_call_us"] > 0
    assert set(document["ratios"]) == {"stream_cpu", "stream_p50", "peer_cpu", "peer_p50"}
    assert all(value > 0 for value in document["ratios"].values())
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("transport: grpc_stream/tcp_stream cpu "), last
    assert "peer_stream/tcp_stream cpu " in last, last
    assert "GOAWAY" not in done.stderr


@pytest.mark.integration
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--messages=0"], "--messages must be at least 1, got 0"),
        (["--trials=0"], "--trials must be at least 1, got 0"),
        (["--probes=grpc_stream,carrier_pigeon"], "unknown probe carrier_pigeon"),
    ],
)
def test_bad_arguments_get_one_line_errors(
    tmp_path: Path, arguments: list[str], message: str
) -> None:
    done = run_bench(*arguments, f"--out={tmp_path / 'transport.json'}")
    assert done.returncode == 2
    assert message in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "transport.json").exists()
