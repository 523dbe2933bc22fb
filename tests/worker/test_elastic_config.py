"""The elastic loop's and the torchrun backend's settings: one object each, every default
from ``rallypoint.proto.v1.defaults`` (typed nowhere else), ``elastic_training``'s keyword
arguments made from ElasticConfig's fields, a misspelt one refused when the run is made, and
the job a run creates the same as the one it created before the settings object."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
import torch
from torch.distributed.elastic.rendezvous import RendezvousParameters

from rallypoint.client import JobConfig
from rallypoint.proto.v1.defaults import ELASTIC, JOB_CONFIG, TORCHRUN_AGENT, TORCHRUN_JOB
from rallypoint.worker.elastic import ElasticConfig, ElasticRun, TrainState
from rallypoint.worker.torchrun import RendezvousSettings

REQUIRED: dict[str, Any] = {
    "job": "j",
    "name": "w",
    "checkpoint_dir": "ckpt",
    "min_nodes": 1,
    "max_nodes": 2,
}


def state() -> TrainState:
    model = torch.nn.Linear(2, 1)
    return TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_every_elastic_default_is_the_table_s() -> None:
    defaults = {
        f.name: f.default
        for f in dataclasses.fields(ElasticConfig)
        if f.default is not dataclasses.MISSING
    }
    from_tables = 0
    for name, value in dataclasses.asdict(ELASTIC).items():
        assert defaults[name] == value, name
        from_tables += 1
    for name, value in dataclasses.asdict(JOB_CONFIG).items():
        seconds = f"{name.removesuffix('_ms')}_s"
        if name in defaults:
            assert defaults[name] == value, name
            from_tables += 1
        elif name.endswith("_ms") and seconds in defaults:
            assert defaults[seconds] * 1000 == value, name
            from_tables += 1
    # The rest default to None ("none", or derived: connect_timeout_s from join_timeout_s).
    assert all(value is None for name, value in defaults.items() if name not in _tabled())
    assert from_tables == len(_tabled())


def _tabled() -> set[str]:
    names = set(dataclasses.asdict(ELASTIC))
    fields = {f.name for f in dataclasses.fields(ElasticConfig)}
    for name in dataclasses.asdict(JOB_CONFIG):
        seconds = f"{name.removesuffix('_ms')}_s"
        names |= {name, seconds} & fields
    return names


def test_the_run_takes_every_setting_as_a_keyword_with_the_config_s_default() -> None:
    run_parameters = inspect.signature(ElasticRun).parameters
    config_parameters = inspect.signature(ElasticConfig).parameters
    assert set(run_parameters) == {*config_parameters, "state", "on_event"}
    for name, parameter in config_parameters.items():
        assert run_parameters[name].default == parameter.default, name
        assert run_parameters[name].kind == parameter.kind, name


def test_the_run_keeps_its_settings_and_the_job_it_creates() -> None:
    run = ElasticRun("127.0.0.1:2379", state=state(), **REQUIRED, hang_floor_s=2.0)
    assert run.settings == ElasticConfig("127.0.0.1:2379", **REQUIRED, hang_floor_s=2.0)
    # As elastic_training built it before ElasticConfig: every JobConfig field it has a
    # setting for (their defaults are JobConfig's own), in milliseconds, and scale_up.
    assert run.config == JobConfig(1, 2, scale_up=True, hang_floor_ms=2000)


def test_a_misspelt_or_missing_argument_is_refused_when_the_run_is_made() -> None:
    with pytest.raises(TypeError, match="heartbeat_interval"):
        # A type checker refuses it too: the signature is ElasticConfig's.
        ElasticRun("127.0.0.1:2379", state=state(), heartbeat_interval=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="state"):
        ElasticRun("127.0.0.1:2379", **REQUIRED)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"join_timeout_s": 0}, r"elastic_training\(join_timeout_s=0\): must be more than 0"),
        (
            {"connect_timeout_s": float("inf")},
            r"elastic_training\(connect_timeout_s=inf\): must be more than 0",
        ),
        ({"snapshot_every": -1}, r"elastic_training\(snapshot_every=-1\): must be >= 0"),
        (
            {"snapshot_copies": 2, "snapshot_erasure": (2, 1)},
            "give snapshot_copies or snapshot_erasure, not both",
        ),
    ],
)
def test_a_bad_setting_is_refused_in_one_line(setting: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ElasticConfig("127.0.0.1:2379", **REQUIRED, **setting)


def test_the_token_stays_out_of_the_settings_repr() -> None:
    assert "s3cret" not in repr(ElasticConfig("127.0.0.1:2379", **REQUIRED, token="s3cret"))


def test_torchrun_settings_default_to_the_tables_whether_made_or_parsed() -> None:
    parameters = RendezvousParameters(
        "rallypoint", "127.0.0.1:2379", "job", 1, 2, local_addr="node"
    )
    parsed = RendezvousSettings.from_parameters(parameters)
    made = RendezvousSettings(
        endpoints=parsed.endpoints, job="job", min_nodes=1, max_nodes=2, node_name="node"
    )
    assert parsed == made
    assert made.join_timeout_s == made.connect_timeout_s == TORCHRUN_JOB.join_timeout_ms / 1000
    assert made.last_call_s == TORCHRUN_JOB.last_call_ms / 1000
    assert made.heartbeat_interval_s == TORCHRUN_JOB.heartbeat_interval_ms / 1000
    assert made.phi_threshold == TORCHRUN_JOB.phi_threshold
    assert made.acceptable_pause_s == TORCHRUN_JOB.acceptable_pause_ms / 1000
    assert made.client_timeout_s == TORCHRUN_AGENT.client_timeout_s
    assert made.store_timeout_s == TORCHRUN_AGENT.store_timeout_s
    assert made.bridge_host == TORCHRUN_AGENT.bridge_host
    # The job an agent creates: torch's rendezvous timeout, a second's last call.
    job = made.job_config()
    assert (job.join_timeout_ms, job.last_call_ms, job.acceptable_pause_ms) == (900_000, 1000, 500)
