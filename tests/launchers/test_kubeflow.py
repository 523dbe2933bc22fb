"""Kubeflow training operator: deploy/kubeflow/pytorchjob-elastic.yaml, a PyTorchJob whose
elasticPolicy names the ``rallypoint`` backend and the members' Service.

- Offline, against the operator's published CRD schema (kubeflow/pytorchjob-crd-v1.9.0.json,
  vendored with its source and version; strictly: a field the schema does not name is an
  error, as ``kubectl apply --validate=strict`` makes it).
- What the operator makes of it (launchers.operator_environment, from the operator's Go
  source): torchrun's PET_* variables, which the container's plain ``torchrun`` reads as its
  options; the backend name goes through unchecked (the CRD's ``rdzvBackend`` is a free
  string and the webhook does not look at it).
- Real (make test-launchers): two Worker containers as the operator starts them (the same
  command and variables, pointed at a local cluster), a worker SIGKILLed, the job recovers.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.integration.harness import ProcessCluster

from .harness import REPOSITORY, real_job, record
from .launchers import (
    KUBEFLOW_JOB,
    Target,
    check_recovered,
    kubeflow_job,
    operator_environment,
    run_kill_trial,
)

SCHEMA_FILE = Path(__file__).with_name("kubeflow") / "pytorchjob-crd-v1.9.0.json"


def strict(schema: Any) -> Any:
    """The schema with ``additionalProperties: false`` on every object that lists its
    properties and keeps no unknown fields: the API server prunes unknown fields silently
    (or refuses them under strict field validation); here they are errors."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    vendored = json.loads(SCHEMA_FILE.read_text())
    assert vendored["source"].endswith("/v1.9.0/manifests/base/crds/kubeflow.org_pytorchjobs.yaml")
    return jsonschema.Draft7Validator(strict(vendored["openAPIV3Schema"]))


def test_the_pytorchjob_validates_against_the_operators_crd(
    validator: jsonschema.Draft7Validator,
) -> None:
    job = yaml.safe_load(KUBEFLOW_JOB.read_text())
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(job)]
    assert errors == []
    policy = job["spec"]["elasticPolicy"]
    assert policy["rdzvBackend"] == "rallypoint"


@pytest.mark.parametrize(
    "change",
    [
        ("rdzvBackEnd", "rallypoint"),  # a misspelt field
        ("rdzvPort", "2379"),  # a port as a string
        ("minReplicas", 1.5),
    ],
)
def test_the_schema_check_catches_mistakes(
    validator: jsonschema.Draft7Validator, change: tuple[str, Any]
) -> None:
    job = copy.deepcopy(yaml.safe_load(KUBEFLOW_JOB.read_text()))
    key, value = change
    job["spec"]["elasticPolicy"][key] = value
    assert list(validator.iter_errors(job)), f"{key}={value!r} passed the schema"


def test_the_operators_variables_make_torchrun_use_the_members_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch.distributed.run import config_from_args, get_args_parser

    from rallypoint.worker import torchrun as backend

    job = yaml.safe_load(KUBEFLOW_JOB.read_text())
    env = operator_environment(job)
    assert env["PET_RDZV_BACKEND"] == "rallypoint"
    assert env["PET_RDZV_ENDPOINT"] == "rallypoint-client:2379"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    (container,) = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert container["command"][0] == "torchrun"
    config, _, args = config_from_args(get_args_parser().parse_args(container["command"][1:]))
    assert config.rdzv_backend == backend.BACKEND
    assert config.rdzv_endpoint == "rallypoint-client:2379"
    assert config.run_id == job["metadata"]["name"]
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (1, 2, 2)
    assert config.max_restarts == 3
    assert set(config.rdzv_configs) - {"rank", "timeout", "join_timeout"} <= backend._OUR_KEYS
    assert args[-1] == "train.py"
    # The Service it names serves the members' client port.
    services = {
        doc["metadata"]["name"]: doc
        for doc in yaml.safe_load_all((REPOSITORY / "deploy/kubernetes/service.yaml").read_text())
    }
    ports = {p["name"]: p["port"] for p in services["rallypoint-client"]["spec"]["ports"]}
    assert ports["client"] == job["spec"]["elasticPolicy"]["rdzvPort"]


def test_without_rdzv_id_torchrun_would_use_none() -> None:
    """Why the manifest sets rdzvId: the operator sets PET_RDZV_ID only from it."""
    job = kubeflow_job()
    del job["spec"]["elasticPolicy"]["rdzvId"]
    assert "PET_RDZV_ID" not in operator_environment(job)


@pytest.mark.launchers
@pytest.mark.timeout(900)
@real_job
def test_pytorchjob_workers_recover_a_killed_worker(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    # The Service is one address: one member's (the client finds the leader).
    target = Target("rallypoint", cluster.endpoints[:1])
    outcome = run_kill_trial("kubeflow", target, "resnet-elastic", tmp_path)
    record("kubeflow", "rallypoint", outcome.recovery)
    check_recovered(outcome, nodes=2)
