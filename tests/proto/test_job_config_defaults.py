"""JobConfig's defaults have one source (``rallypoint.proto.v1.defaults``): the comments of
``rendezvous.proto``, the client's and the state machine's JobConfig, and the elastic worker's
keyword defaults all agree with it."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from rallypoint.client.rendezvous_values import JobConfig as ClientJobConfig
from rallypoint.coordinator.state.jobs import JobConfig as StateJobConfig
from rallypoint.proto.v1 import rendezvous_pb2
from rallypoint.proto.v1.defaults import JOB_CONFIG, JOB_CONFIG_REQUIRED, milli

PROTO = Path(rendezvous_pb2.__file__).with_name("rendezvous.proto")
# A field line of the message, and its trailing comment: `int64 x = 3;  // default 0`.
_FIELD = re.compile(r"^\s*(\w+)\s+(\w+)\s*=\s*\d+\s*;\s*(?://\s*(.*?))?\s*$")
_FACTORS = {"phi_threshold", "hang_factor", "straggler_factor"}


def documented_defaults() -> dict[str, object]:
    """rendezvous.proto's JobConfig fields: name -> documented default ("required" for none)."""
    text = PROTO.read_text()
    body = text[text.index("message JobConfig {") :]
    body = body[: body.index("\n}")]
    documented: dict[str, object] = {}
    for line in body.splitlines()[1:]:
        match = _FIELD.match(line)
        if match is None:
            continue
        proto_type, name, comment = match.groups()
        if comment == "required":
            documented[name] = "required"
            continue
        assert comment and comment.startswith("default "), (
            f"rendezvous.proto: JobConfig.{name} states no `// default <value>`"
        )
        word = comment.removeprefix("default ")
        if proto_type == "bool":
            assert word in ("true", "false"), line
            documented[name] = word == "true"
        elif proto_type in ("double", "float"):
            documented[name] = float(word)
        else:
            documented[name] = int(word)
    return documented


def test_the_proto_documents_every_field_and_the_same_defaults_as_the_table() -> None:
    documented = documented_defaults()
    wire_fields = [f.name for f in rendezvous_pb2.JobConfig.DESCRIPTOR.fields]
    assert list(documented) == wire_fields
    table = dataclasses.asdict(JOB_CONFIG)
    assert {name for name, value in documented.items() if value == "required"} == set(
        JOB_CONFIG_REQUIRED
    )
    assert {k: v for k, v in documented.items() if v != "required"} == table
    for name, value in table.items():  # and of the wire's type: 8.0, not 8
        assert type(documented[name]) is type(value), name


def test_the_client_job_config_takes_the_table_defaults() -> None:
    config = ClientJobConfig(2, 4)
    assert [f.name for f in dataclasses.fields(ClientJobConfig)] == [
        *JOB_CONFIG_REQUIRED,
        *dataclasses.asdict(JOB_CONFIG),
    ]
    for name, value in dataclasses.asdict(JOB_CONFIG).items():
        assert getattr(config, name) == value, name
    assert ClientJobConfig.from_proto(config.to_proto()) == config


def test_the_state_machine_job_config_takes_the_table_defaults_in_its_units() -> None:
    config = StateJobConfig(2, 4)
    state_fields = [f.name for f in dataclasses.fields(StateJobConfig)]
    assert state_fields[:2] == list(JOB_CONFIG_REQUIRED)
    expected = {
        (f"{name}_milli" if name in _FACTORS else name): (milli(v) if name in _FACTORS else v)
        for name, v in dataclasses.asdict(JOB_CONFIG).items()
    }
    assert state_fields[2:] == list(expected)
    for name, value in expected.items():
        assert getattr(config, name) == value, name


@pytest.mark.parametrize(
    ("factor", "thousandths"), [(8.0, 8000), (2.5, 2500), (0.0, 0), (0.001, 1), (1.2345, 1234)]
)
def test_factors_are_kept_in_thousandths(factor: float, thousandths: int) -> None:
    assert milli(factor) == thousandths


def test_the_elastic_worker_keyword_defaults_agree_with_the_table() -> None:
    from rallypoint.worker.elastic import ElasticRun

    parameters = inspect.signature(ElasticRun.__init__).parameters
    compared = 0
    for name, value in dataclasses.asdict(JOB_CONFIG).items():
        if name in parameters:
            assert parameters[name].default == value, name
            compared += 1
        elif name.endswith("_ms") and f"{name[:-3]}_s" in parameters:
            assert parameters[f"{name[:-3]}_s"].default * 1000 == value, name
            compared += 1
    assert compared >= 10
