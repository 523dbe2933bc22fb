"""The deployment files (deploy/) against the Kubernetes API and against the code.

- Schema: every manifest validates against the Kubernetes OpenAPI schemas that
  kubernetes-validate bundles, strictly (an unknown field is an error), for the oldest and
  the newest Kubernetes these files are meant for. The PyTorchJob's CRD has no bundled
  schema: its pod templates are validated as core PodTemplates, the rest of it is not.
- Code: each member's container command is run (its shell wrapper, with the pod name the
  StatefulSet gives) and the argument vector it execs is parsed by ``rallypoint serve``'s
  own parser, then checked as the daemon checks it before starting, with the Secrets that
  make-secrets.sh makes mounted where the StatefulSet mounts them. Ports agree between
  flags, container ports, probes and Services; the peer list names the headless Service's
  DNS names; the training pods' torchrun command parses with torchrun's parser and its
  rendezvous settings with the backend's, their token's role is their job's.
- The systemd unit passes ``systemd-analyze verify`` and its settings are the daemon's.
"""

from __future__ import annotations

import argparse
import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from rallypoint.coordinator.cli.main import build_parser
from rallypoint.coordinator.daemon import Settings, parse_initial_cluster
from rallypoint.coordinator.peer_auth import member_name
from rallypoint.coordinator.service.tokens import ClientTokens

from .files import (
    DEPLOY,
    KUBERNETES,
    ROOT,
    SYSTEMD,
    Document,
    documents,
    environment_file,
    every_document,
    exec_argv,
    make_secrets,
    manifest_files,
    mount_secrets,
    one,
    pod_templates,
    relocate,
    unit_entries,
)

# The oldest Kubernetes these manifests are for (grpc probes are GA from 1.27) and the newest
# schema kubernetes-validate bundles.
KUBERNETES_VERSIONS = ("1.28", "1.37")
NAMESPACE = "training"
JOB = "resnet"
# Kinds whose schema is not Kubernetes' own: only their pod templates are validated.
CUSTOM_KINDS = {("kubeflow.org/v1", "PyTorchJob")}


def validate(doc: Document, version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def as_pod_template(template: Document) -> Document:
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "t"},
        "template": template,
    }


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(KUBERNETES)))
def test_every_manifest_validates_against_the_kubernetes_schema(path: Path, version: str) -> None:
    docs = documents(path)
    assert docs, f"{path} holds no manifest"
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
            for replica in doc["spec"]["pytorchReplicaSpecs"].values():
                validate(as_pod_template(replica["template"]), version)
        else:
            validate(doc, version)


def test_the_schema_check_refuses_unknown_fields_and_wrong_types() -> None:
    statefulset = one("StatefulSet", "rallypoint")
    container_path = ("spec", "template", "spec", "containers", 0)
    mutations: list[tuple[tuple[Any, ...], str, Any]] = [
        (("spec",), "replica", 3),  # a misspelt field
        ((*container_path, "readinessProbe", "grpc"), "port", "health"),  # grpc wants a number
        ((*container_path, "readinessProbe"), "grpc", {"port": 2381, "tls": True}),
        (("spec", "template", "spec"), "terminationGracePeriod", 30),
    ]
    for path, key, value in mutations:
        wrong = copy.deepcopy(statefulset)
        target = wrong
        for step in path:
            target = target[step]
        target[key] = value
        for version in KUBERNETES_VERSIONS:
            with pytest.raises(kubernetes_validate.ValidationError):
                validate(wrong, version)


def test_the_manifests_are_namespace_agnostic_and_of_known_kinds() -> None:
    kinds = set()
    for path, doc in every_document():
        assert "namespace" not in doc["metadata"], f"{path}: names a namespace"
        kinds.add(doc["kind"])
    assert kinds == {"Service", "StatefulSet", "PodDisruptionBudget", "Job", "PyTorchJob"}


# ------------------------------------------------------------------------- the members


def statefulset() -> Document:
    return one("StatefulSet", "rallypoint")


def member_container() -> Document:
    (container,) = statefulset()["spec"]["template"]["spec"]["containers"]
    return container


def container_ports() -> dict[str, int]:
    return {port["name"]: port["containerPort"] for port in member_container()["ports"]}


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Path]]:
    return make_secrets(tmp_path_factory.mktemp("secrets"), NAMESPACE, JOB)


def serve_settings(ordinal: int, scratch: Path) -> tuple[list[str], Settings]:
    """The argument vector member ``ordinal``'s container execs, and the settings
    ``rallypoint serve`` makes of it (with its own parser)."""
    command = member_container()["command"]
    assert command[:2] == ["/usr/bin/tini", "--"], "tini forwards signals to the member"
    assert command[2:4] == ["/bin/sh", "-c"]
    pod_name = f"{statefulset()['metadata']['name']}-{ordinal}"
    argv = exec_argv(command[4], "rallypoint", {"POD_NAME": pod_name}, scratch)
    parser = build_parser()
    args = parser.parse_args(argv)  # SystemExit on an unknown flag or a bad value
    assert args.command == "serve"
    # Each flag spelt in full: argparse would take an abbreviation of a longer one.
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    known = set(subparsers.choices["serve"]._option_string_actions)
    for word in argv[1:]:
        assert word.partition("=")[0] in known, f"{word!r} is not a flag of rallypoint serve"
    assert args.config is None
    settings = Settings()
    settings.merge(
        {
            name: getattr(args, name)
            for name in Settings.field_names()
            if getattr(args, name, None) is not None
        },
        "command line",
    )
    return argv, settings


def test_three_members_start_together_one_per_node() -> None:
    spec = statefulset()["spec"]
    assert spec["replicas"] == 3
    # A new member waits for every other initial one before it turns ready.
    assert spec["podManagementPolicy"] == "Parallel"
    labels = spec["template"]["metadata"]["labels"]
    assert matches(spec["selector"]["matchLabels"], labels)
    (term,) = spec["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert matches(term["labelSelector"]["matchLabels"], labels)


def test_the_headless_service_names_members_before_they_are_ready() -> None:
    spec = statefulset()["spec"]
    headless = one("Service", spec["serviceName"])["spec"]
    assert headless["clusterIP"] == "None"
    assert headless["publishNotReadyAddresses"] is True
    labels = spec["template"]["metadata"]["labels"]
    ports = container_ports()
    for service in (headless, one("Service", "rallypoint-client")["spec"]):
        assert matches(service["selector"], labels)
        for port in service["ports"]:
            # Peers and clients dial the port numbers of --initial-cluster: each Service port
            # is the container port of the same name.
            assert ports[port["targetPort"]] == port["port"], port
    assert {port["targetPort"] for port in headless["ports"]} == {"client", "peer"}


def test_the_disruption_budget_keeps_a_majority() -> None:
    spec = statefulset()["spec"]
    budget = one("PodDisruptionBudget", "rallypoint")["spec"]
    assert matches(budget["selector"]["matchLabels"], spec["template"]["metadata"]["labels"])
    replicas = spec["replicas"]
    assert budget["maxUnavailable"] == 1
    assert replicas - budget["maxUnavailable"] >= replicas // 2 + 1


@pytest.mark.parametrize("ordinal", [0, 1, 2])
def test_each_member_runs_serve_with_settings_the_daemon_accepts(
    ordinal: int, secrets: dict[str, dict[str, Path]], tmp_path: Path
) -> None:
    argv, settings = serve_settings(ordinal, tmp_path / "run")
    member_id = ordinal + 1
    assert settings.member_id == member_id, argv
    pod_spec = statefulset()["spec"]["template"]["spec"]
    # The Secrets as make-secrets.sh makes them, where the StatefulSet mounts them.
    mounted = mount_secrets(pod_spec, member_container(), secrets, tmp_path / "mounts")
    assert set(mounted) >= {
        str(Path(path).parent)
        for path in (settings.peer_secret_file, settings.tls_cert_file, settings.tokens_file)
    }
    for name in ("peer_secret_file", "tls_cert_file", "tls_key_file", "tls_ca_file", "tokens_file"):
        setattr(settings, name, relocate(getattr(settings, name), mounted))
    # Everything `rallypoint serve` checks before it touches the data dir.
    config = settings.node_config()
    tls = settings.tls()
    assert tls is not None, "TLS on both ports"
    tls.check()
    tokens = settings.client_tokens()
    assert tokens is not None and tokens.path
    assert settings.peer_secret == "" and settings.auth_token == "", "secrets only in files"
    # The data dir is on the member's own volume.
    (claim,) = statefulset()["spec"]["volumeClaimTemplates"]
    (data_mount,) = [
        m for m in member_container()["volumeMounts"] if m["name"] == claim["metadata"]["name"]
    ]
    assert Path(config.data_dir).is_relative_to(data_mount["mountPath"])
    # Its certificate names it as a peer and as the host its peers and clients dial.
    own = parse_initial_cluster(settings.initial_cluster)[member_id]
    names = subject_alternative_names(Path(settings.tls_cert_file))
    assert f"DNS:{member_name(member_id)}" in names
    assert f"DNS:{own.peer_address.rpartition(':')[0]}" in names
    assert f"DNS:{own.peer_address.rpartition(':')[0]}.{NAMESPACE}.svc" in names


def subject_alternative_names(certificate: Path) -> set[str]:
    out = subprocess.run(
        ["openssl", "x509", "-in", str(certificate), "-noout", "-ext", "subjectAltName"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {name.strip() for name in out.splitlines()[-1].split(",")}


def test_ports_agree_between_flags_container_probes_and_peers(tmp_path: Path) -> None:
    _, settings = serve_settings(0, tmp_path)
    ports = container_ports()
    assert ports == {
        "client": port_of(settings.client_address),
        "peer": port_of(settings.peer_address),
        "health": port_of(settings.health_address),
        "metrics": port_of(settings.metrics_address),
    }
    for setting, _ in settings.listeners():
        assert getattr(settings, setting).startswith("0.0.0.0:"), f"{setting} on every interface"
    container = member_container()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        # The kubelet's grpc probe has no TLS: it checks the plaintext health port.
        assert container[probe]["grpc"]["port"] == ports["health"], probe
        assert container[probe]["grpc"].get("service", "") == ""
    # The peer list: member i is pod <statefulset>-(i-1) under the headless Service.
    name = statefulset()["metadata"]["name"]
    service = statefulset()["spec"]["serviceName"]
    members = parse_initial_cluster(settings.initial_cluster)
    assert sorted(members) == list(range(1, statefulset()["spec"]["replicas"] + 1))
    for member_id, address in members.items():
        host = f"{name}-{member_id - 1}.{service}"
        assert address.peer_address == f"{host}:{ports['peer']}"
        assert address.client_address == f"{host}:{ports['client']}"


def test_the_member_runs_as_the_image_user_and_stops_within_its_grace() -> None:
    pod_spec = statefulset()["spec"]["template"]["spec"]
    context = pod_spec["securityContext"]
    uid = dockerfile_uid()
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] == context["fsGroup"] == uid
    unit = dict((key, value) for _, key, value in unit_entries(SYSTEMD / "rallypoint@.service"))
    # The same stop budget under both supervisors: a leader's handover (up to 3 s) and the
    # close of its ports and log, with room.
    assert pod_spec["terminationGracePeriodSeconds"] == int(unit["TimeoutStopSec"]) >= 10


# ---------------------------------------------------------------------------- training


def torchrun_containers() -> list[tuple[str, Document, Document]]:
    found = []
    for where, template in pod_templates():
        for container in template["spec"]["containers"]:
            if container.get("command", [None])[0] == "torchrun":
                found.append((where, template["spec"], container))
    return found


def test_both_training_examples_run_torchrun() -> None:
    kinds = {where.split(": ")[1].split()[0] for where, _, _ in torchrun_containers()}
    assert kinds == {"Job", "PyTorchJob"}


@pytest.mark.parametrize("index", [0, 1])
def test_training_pods_rendezvous_on_the_members_with_their_jobs_token(
    index: int, secrets: dict[str, dict[str, Path]], tmp_path: Path
) -> None:
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.run import config_from_args, get_args_parser

    from rallypoint.worker.torchrun import BACKEND, RendezvousSettings

    where, pod_spec, container = torchrun_containers()[index]
    config, _, _ = config_from_args(get_args_parser().parse_args(container["command"][1:]))
    assert config.rdzv_backend == BACKEND, where
    assert config.run_id == JOB, where
    # The endpoints are the members' client addresses.
    _, settings = serve_settings(0, tmp_path / "member")
    members = parse_initial_cluster(settings.initial_cluster).values()
    assert config.rdzv_endpoint.split(",") == [m.client_address for m in members]
    # The rendezvous settings, with the job's Secret mounted as the pod mounts it.
    mounted = mount_secrets(pod_spec, container, secrets, tmp_path / "mounts")
    conf = {key: relocate(str(value), mounted) for key, value in config.rdzv_configs.items()}
    (token_env,) = [e for e in container["env"] if e["name"] == "RALLYPOINT_TOKEN"]
    ref = token_env["valueFrom"]["secretKeyRef"]
    token = secrets[ref["name"]][ref["key"]].read_text()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RALLYPOINT_TOKEN", token)
        parameters = RendezvousParameters(
            backend=config.rdzv_backend,
            endpoint=config.rdzv_endpoint,
            run_id=config.run_id,
            min_nodes=config.min_nodes,
            max_nodes=config.max_nodes,
            **conf,
        )
        rendezvous = RendezvousSettings.from_parameters(parameters)
    assert rendezvous.tls is not None, f"{where}: the members require TLS"
    assert rendezvous.token == token
    # The members know the token, as a token of this job.
    grant = ClientTokens(path=str(secrets["rallypoint-tokens"]["tokens.toml"])).lookup(
        token.encode()
    )
    assert grant is not None and grant.role.name == f"job:{JOB}"


# ---------------------------------------------------------------------------- the image


def dockerfile_lines() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = (DEPLOY / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    return [line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"]


def dockerfile_uid() -> int:
    (user,) = [line for line in dockerfile_lines() if line.startswith("USER ")]
    return int(user.split()[1].partition(":")[0])


def test_the_image_installs_the_server_extra_from_the_package_sources() -> None:
    lines = dockerfile_lines()
    assert lines[0] == "FROM python:3.11-slim"
    installs = [line for line in lines if "pip install" in line]
    assert len(installs) == 1
    extras = re.findall(r"'\.\[([a-z,]+)\]'", installs[0])
    assert extras == ["server"], "members need the daemon, never torch"
    # What the build copies is what pyproject.toml builds the package from.
    from tests.packaging.layout import pyproject

    copied = {
        source.rstrip("/")
        for line in lines
        if line.startswith("COPY ")
        for source in line.split()[1:-1]
    }
    needed = {"pyproject.toml", pyproject()["project"]["readme"]}
    needed |= set(pyproject()["tool"]["setuptools"]["package-dir"].values())
    assert copied == needed
    assert all((ROOT / source).exists() for source in copied)
    (entrypoint,) = [line for line in lines if line.startswith("ENTRYPOINT ")]
    assert '"/usr/bin/tini", "--", "rallypoint"' in entrypoint
    exposed = {int(p) for line in lines if line.startswith("EXPOSE ") for p in line.split()[1:]}
    assert exposed == set(container_ports().values())


# ---------------------------------------------------------------------------- systemd


def test_the_systemd_unit_runs_serve_from_the_member_environment_file() -> None:
    entries = unit_entries(SYSTEMD / "rallypoint@.service")
    service = {key: value for section, key, value in entries if section == "Service"}
    assert service["ExecStart"].split()[1:] == ["serve"]
    assert service["ExecStart"].split()[0].endswith("/rallypoint")
    assert service["EnvironmentFile"] == "/etc/rallypoint/member-%i.env"
    assert service["User"] == "rallypoint"
    assert service["Restart"] == "on-failure"
    # Exit code 2 is a refusal to start: the same settings would be refused again.
    assert service["RestartPreventExitStatus"] == "2"
    assert int(service["LimitNOFILE"]) >= 65536
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    unit = {key: value for section, key, value in entries if section == "Unit"}
    assert int(unit["StartLimitBurst"]) * int(service["RestartSec"]) < int(
        unit["StartLimitIntervalSec"]
    ), "restarts that keep failing hit the start limit"
    environment = dict(
        value.split("=", 1) for section, key, value in entries if key == "Environment"
    )
    assert environment == {
        "RALLYPOINT_MEMBER_ID": "%i",
        "RALLYPOINT_DATA_DIR": "/var/lib/rallypoint/member-%i",
    }
    # The data dir is the one path the hardened unit may write.
    assert service["ProtectSystem"] == "strict"
    assert "/var/lib/" + service["StateDirectory"] == environment["RALLYPOINT_DATA_DIR"]
    known = {key for _, key, _ in entries}
    assert {"TimeoutStopSec", "KillSignal", "NoNewPrivileges", "SystemCallFilter"} <= known


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    """``systemd-analyze verify`` of instance 1, with no warning at all (an unknown or
    misspelt key is only a warning). It checks that ExecStart exists, so the copy runs
    /usr/bin/true there."""
    unit = (SYSTEMD / "rallypoint@.service").read_text()
    exec_start = re.compile(r"^ExecStart=\S+", re.MULTILINE)
    assert len(exec_start.findall(unit)) == 1
    (tmp_path / "rallypoint@.service").write_text(exec_start.sub("ExecStart=/usr/bin/true", unit))
    (tmp_path / "rallypoint@1.service").symlink_to("rallypoint@.service")
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(tmp_path / "rallypoint@1.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_the_example_environment_file_is_settings_the_daemon_accepts(tmp_path: Path) -> None:
    variables = environment_file(SYSTEMD / "member.env.example")
    known = {"RALLYPOINT_" + name.upper() for name in Settings.field_names()}
    # The daemon ignores a variable that names no setting: a misspelt one would go unseen.
    assert set(variables) <= known, set(variables) - known
    secret = tmp_path / "peer-secret"
    secret.write_text("ab" * 32 + "\n")
    settings = Settings()
    # As the unit starts instance 1 (its own Environment= lines come first).
    settings.merge_environment(
        {"RALLYPOINT_MEMBER_ID": "1", "RALLYPOINT_DATA_DIR": "/var/lib/rallypoint/member-1"}
        | variables
        | {"RALLYPOINT_PEER_SECRET_FILE": str(secret)}
    )
    settings.node_config()
    assert settings.tls() is not None
    assert settings.tls_cert_file.endswith("/member-1.crt")
    assert settings.tls_key_file.endswith("/member-1.key")
    assert settings.member_id == 1


# ---------------------------------------------------------------- docs/deployment.md


def deployment_page() -> str:
    return (ROOT / "docs" / "deployment.md").read_text()


def test_the_deployment_page_links_every_deployment_file_and_shows_the_jobs_command() -> None:
    section = deployment_page()
    linked = {ROOT / link for link in re.findall(r"\]\(\.\./(deploy/[^)]+)\)", section)}
    assert all(path.exists() for path in linked), linked
    files = {path for path in DEPLOY.rglob("*") if path.is_file()}
    assert files == linked
    # The torchrun command it shows is the one the PyTorchJob runs (the Job differs in --nnodes).
    block = re.search(r"^    torchrun .*?train\.py$", section, re.MULTILINE | re.DOTALL)
    assert block is not None
    shown = block.group(0).replace("\\\n", " ").split()
    (command,) = [c["command"] for w, _, c in torchrun_containers() if ": PyTorchJob " in w]
    assert shown == command
