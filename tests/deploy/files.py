"""Reading the deployment files (deploy/) as the machines that use them would: the manifests
as YAML documents, a container's shell command run to see the argument vector it execs, the
Secrets make-secrets.sh creates (through a kubectl that records its arguments instead of
calling a cluster) laid out as the kubelet mounts them, and systemd unit files."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
SYSTEMD = DEPLOY / "systemd"

Document = dict[str, Any]


def manifest_files() -> list[Path]:
    return sorted(KUBERNETES.rglob("*.yaml"))


def documents(path: Path) -> list[Document]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def every_document() -> Iterator[tuple[Path, Document]]:
    for path in manifest_files():
        for doc in documents(path):
            yield path, doc


def one(kind: str, name: str) -> Document:
    found = [
        doc
        for _, doc in every_document()
        if doc["kind"] == kind and doc["metadata"]["name"] == name
    ]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def pod_templates() -> Iterator[tuple[str, Document]]:
    """(where, pod template) of every workload, a PyTorchJob's replicas included."""
    for path, doc in every_document():
        where = f"{path.relative_to(ROOT)}: {doc['kind']} {doc['metadata']['name']}"
        spec = doc.get("spec", {})
        if "template" in spec:
            yield where, spec["template"]
        for replica, replica_spec in spec.get("pytorchReplicaSpecs", {}).items():
            yield f"{where} {replica}", replica_spec["template"]


# ----------------------------------------------------------------------------- the Secrets


def make_secrets(
    out: Path, namespace: str, job: str, extra_sans: str = ""
) -> dict[str, dict[str, Path]]:
    """Run make-secrets.sh; return each Secret it creates: name -> {key: file}."""
    calls = out / "kubectl-calls"
    calls.mkdir(parents=True)
    recorder = out / "kubectl"
    # One file per call, the arguments NUL-separated: what kubectl would have been asked.
    recorder.write_text(
        f"#!/bin/sh\nn=$(ls {shlex.quote(str(calls))} | wc -l)\n"
        f'printf "%s\\0" "$@" > {shlex.quote(str(calls))}/$n\n'
    )
    recorder.chmod(0o755)
    files = out / "files"
    subprocess.run(
        [str(KUBERNETES / "make-secrets.sh"), "-n", namespace, "-j", job, str(files)],
        env={**os.environ, "KUBECTL": str(recorder), "EXTRA_SANS": extra_sans},
        check=True,
        capture_output=True,
        timeout=120,
    )
    secrets: dict[str, dict[str, Path]] = {}
    for call in sorted(calls.iterdir(), key=lambda p: int(p.name)):
        argv = call.read_text().split("\0")[:-1]
        assert argv[:2] == ["-n", namespace], argv
        assert argv[2:5] == ["create", "secret", "generic"], argv
        name, sources = argv[5], argv[6:]
        keys: dict[str, Path] = {}
        for source in sources:
            assert source.startswith("--from-file="), source
            spec = source.removeprefix("--from-file=")
            key, _, path = spec.rpartition("=")
            keys[key or Path(path).name] = files / path
        secrets[name] = keys
    return secrets


def mount_secrets(
    pod_spec: Document,
    container: Document,
    secrets: dict[str, dict[str, Path]],
    root: Path,
) -> dict[str, Path]:
    """Lay the container's Secret volumes out under ``root`` as the kubelet would (every key,
    or the listed items); return mount path -> local folder."""
    volumes = {volume["name"]: volume for volume in pod_spec.get("volumes", [])}
    mounted: dict[str, Path] = {}
    for mount in container.get("volumeMounts", []):
        # A volume claim template's mount has no volume in the pod spec.
        secret = volumes.get(mount["name"], {}).get("secret")
        if secret is None:
            continue
        data = secrets[secret["secretName"]]
        items = secret.get("items") or [{"key": key, "path": key} for key in data]
        folder = root / mount["name"]
        folder.mkdir(parents=True)
        for item in items:
            (folder / item["path"]).write_bytes(data[item["key"]].read_bytes())
        mounted[mount["mountPath"]] = folder
    return mounted


def relocate(value: str, mounted: dict[str, Path]) -> str:
    """``value`` with a mount path at its start replaced by its local folder."""
    for mount_path, folder in mounted.items():
        if value.startswith(mount_path.rstrip("/") + "/"):
            return str(folder) + value[len(mount_path.rstrip("/")) :]
    return value


# ------------------------------------------------------------------ a container's command


def exec_argv(script: str, program: str, env: dict[str, str], scratch: Path) -> list[str]:
    """Run ``script`` with ``sh`` and return the arguments it execs ``program`` with (a
    stand-in on PATH records them and exits)."""
    bin_dir = scratch / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    record = scratch / "argv"
    stand_in = bin_dir / program
    stand_in.write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" > {shlex.quote(str(record))}\n')
    stand_in.chmod(0o755)
    subprocess.run(
        ["/bin/sh", "-c", script],
        env={**env, "PATH": f"{bin_dir}:/usr/bin:/bin"},
        check=True,
        timeout=30,
    )
    return record.read_text().split("\0")[:-1]


# --------------------------------------------------------------------------- systemd units


def unit_entries(path: Path) -> list[tuple[str, str, str]]:
    """(section, key, value) of a systemd unit file, in order (keys may repeat)."""
    entries = []
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not a key=value line: {raw!r}"
        entries.append((section, key.strip(), value.strip()))
    return entries


def environment_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (comments and blank lines skipped), as systemd's EnvironmentFile."""
    found = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not a KEY=VALUE line: {raw!r}"
        found[key] = value
    return found
