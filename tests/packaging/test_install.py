"""The three installs, each into a fresh virtualenv, from a wheel built from a copy of the tree.

What a user gets is a wheel, not this checkout: a subpackage missing from pyproject's list, a
dependency declared in the wrong extra or a module that imports a server dependency from the
client all pass every other test (they run against the editable install, which has
everything) and break only here. So: build the wheel once from a copy of the sources (the
build writes into its source tree), then

- base (``pip install rallypoint``): every client and wire-contract module imports, and
  nothing of the server's or torch is installed or imported; the ``rallypoint`` command
  answers any command with the one line naming the server extra;
- ``[server]``: every daemon, CLI and Raft module imports, the command runs, and torch is
  neither installed nor imported;
- ``[worker]``: resolved only (``pip install --dry-run``; installing torch takes minutes and
  gigabytes): it names torch and numpy, and with constraints.txt, as ``make setup`` installs
  it, torch is the pinned CPU build (no ``nvidia-*`` packages).

Needs the package index (pip's cache makes the second run quick); about half a minute.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .layout import ROOT, listed_packages, pyproject

pytestmark = pytest.mark.timeout(600)

SERVER_ONLY = {"grpc_health", "uvloop", "google_crc32c", "prometheus_client", "rich"}
WORKER_ONLY = {"torch", "numpy"}

# Run inside a venv: import every module of the given subpackages (never a __main__), then
# print the top-level names of everything imported, as JSON.
IMPORT_ALL = """
import importlib, json, pkgutil, sys
for root in sys.argv[1:]:
    package = importlib.import_module(root)
    for info in pkgutil.walk_packages(package.__path__, root + "."):
        if info.name.rpartition(".")[2] != "__main__":
            importlib.import_module(info.name)
print(json.dumps(sorted({name.partition(".")[0] for name in sys.modules})))
"""


def clean_environment() -> dict[str, str]:
    """The test's environment without what would make a venv see this checkout or our venv."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME"}}
    env.pop("VIRTUAL_ENV", None)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def run(
    command: list[str | Path], cwd: Path, check: bool = True
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=540,
    )
    if check and result.returncode != 0:
        pytest.fail(f"{command} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("install")


@pytest.fixture(scope="module")
def wheel(workdir: Path) -> Path:
    source = workdir / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in set(pyproject()["tool"]["setuptools"]["package-dir"].values()):
        shutil.copytree(ROOT / folder, source / folder, ignore=ignore)
    out = workdir / "dist"
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, source], workdir)
    (built,) = out.glob("rallypoint-*.whl")
    return built


class Venv:
    def __init__(self, path: Path, workdir: Path) -> None:
        self.path = path
        self.workdir = workdir
        # No pip of its own: this test's pip installs into it (``--python``), which is quicker.
        run([sys.executable, "-m", "venv", "--without-pip", path], workdir)

    def bin(self, name: str) -> Path:
        return self.path / "bin" / name

    def pip(self, *args: str | Path) -> subprocess.CompletedProcess[str]:
        return run(
            [sys.executable, "-m", "pip", "--python", self.bin("python"), *args], self.workdir
        )

    def installed(self) -> set[str]:
        listing = json.loads(self.pip("list", "--format=json").stdout)
        return {entry["name"].lower().replace("_", "-") for entry in listing}

    def import_all(self, *roots: str) -> set[str]:
        result = run([self.bin("python"), "-c", IMPORT_ALL, *roots], self.workdir)
        return set(json.loads(result.stdout.splitlines()[-1]))

    def command(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run([self.bin("rallypoint"), *args], self.workdir, check=False)


@pytest.fixture(scope="module")
def base_venv(workdir: Path, wheel: Path) -> Iterator[Venv]:
    venv = Venv(workdir / "base", workdir)
    venv.pip("install", "-q", wheel)
    yield venv


@pytest.fixture(scope="module")
def server_venv(workdir: Path, wheel: Path) -> Iterator[Venv]:
    venv = Venv(workdir / "server", workdir)
    venv.pip("install", "-q", f"{wheel}[server]")
    yield venv


def test_the_wheel_holds_every_subpackage(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        packages = {
            os.path.dirname(name).replace("/", ".")
            for name in archive.namelist()
            if name.endswith(".py") and name.startswith("rallypoint/")
        }
    assert packages == listed_packages()
    # The subpackages that show the architecture, by name, in case the list itself shrank.
    assert {
        "rallypoint.raft.storage",
        "rallypoint.coordinator.cli",
        "rallypoint.coordinator.leader",
        "rallypoint.coordinator.state",
        "rallypoint.proto.v1",
        "rallypoint.proto.peer.v1",
    } <= packages


def test_base_install_is_the_client_alone(base_venv: Venv) -> None:
    installed = base_venv.installed()
    assert not installed & {"torch", "numpy", "uvloop", "rich", "grpcio-health-checking"}
    imported = base_venv.import_all("rallypoint.client", "rallypoint.proto")
    assert "rallypoint" in imported
    assert not imported & (SERVER_ONLY | WORKER_ONLY)


def test_base_install_command_names_the_server_extra(base_venv: Venv) -> None:
    for args in (["--version"], ["serve", "--data-dir", "x"], ["kv", "get", "key"]):
        result = base_venv.command(*args)
        assert result.returncode == 1, result
        assert result.stdout == ""
        lines = result.stderr.splitlines()
        assert len(lines) == 1, result.stderr
        assert "pip install 'rallypoint[server]'" in lines[0]
    as_module = run(
        [base_venv.bin("python"), "-m", "rallypoint.coordinator"], base_venv.workdir, check=False
    )
    assert as_module.returncode == 1
    assert "Traceback" not in as_module.stderr
    assert "rallypoint[server]" in as_module.stderr


def test_server_install_runs_the_daemon_without_torch(server_venv: Venv) -> None:
    assert not server_venv.installed() & {"torch", "numpy"}
    version = server_venv.command("--version")
    assert version.returncode == 0, version
    assert version.stdout.strip() == f"rallypoint {pyproject()['project']['version']}"
    serve_help = run(
        [server_venv.bin("python"), "-m", "rallypoint.coordinator", "serve", "--help"],
        server_venv.workdir,
    )
    assert "--data-dir" in serve_help.stdout
    assert (
        "kv"
        in run(
            [server_venv.bin("python"), "-m", "rallypoint.coordinator", "--help"],
            server_venv.workdir,
        ).stdout
    )
    imported = server_venv.import_all(
        "rallypoint.raft", "rallypoint.coordinator", "rallypoint.client", "rallypoint.proto"
    )
    assert not imported & WORKER_ONLY


def test_worker_extra_resolves_to_the_pinned_cpu_torch(workdir: Path, wheel: Path) -> None:
    report = workdir / "worker-report.json"
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--dry-run",
            "--ignore-installed",
            "--report",
            report,
            "-c",
            ROOT / "constraints.txt",
            f"rallypoint[worker] @ {wheel.as_uri()}",
        ],
        workdir,
    )
    resolved = {
        item["metadata"]["name"].lower(): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert {"torch", "numpy", "grpcio", "protobuf", "msgpack"} <= set(resolved)
    pins = dict(
        line.split("==", 1)
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    assert resolved["torch"].split("+")[0] == pins["torch"]
    cuda = sorted(name for name in resolved if name.startswith("nvidia-"))
    assert cuda == [], f"[worker] with constraints.txt resolved a CUDA torch build: {cuda}"
    assert not set(resolved) & {"uvloop", "rich", "grpcio-health-checking"}
