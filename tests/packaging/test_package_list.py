"""pyproject.toml against the tree, without building anything.

The package list must name every subpackage, or a regular (non-editable) install silently
leaves modules out (tests/packaging/test_install.py checks the wheel itself). The ``rallypoint``
command's list of server-only modules must match the server extra, or a base install shows a
traceback instead of the one line naming the extra."""

from __future__ import annotations

from rallypoint.coordinator.cli import SERVER_MODULES

from .layout import base, extra, listed_packages, package_folders, pyproject

# Distribution -> the top-level module it installs, for the server extra's distributions.
SERVER_DISTRIBUTION_MODULES = {
    "grpcio-health-checking": "grpc_health",
    "uvloop": "uvloop",
    "google-crc32c": "google_crc32c",
    "prometheus-client": "prometheus_client",
    "rich": "rich",
}


def test_every_subpackage_is_listed() -> None:
    found = set(package_folders())
    listed = listed_packages()
    assert found - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - found == set(), "these listed packages have no folder"


def test_every_package_folder_has_an_init() -> None:
    missing = [
        name for name, folder in package_folders().items() if not (folder / "__init__.py").exists()
    ]
    assert missing == [], "these folders hold Python files but no __init__.py"


def test_the_base_install_is_the_client_library() -> None:
    assert base() == {"grpcio", "protobuf", "msgpack"}
    assert {"torch", "numpy"} <= extra("worker")
    assert not {"torch", "numpy"} & extra("server")


def test_the_command_knows_every_server_only_module() -> None:
    assert set(SERVER_DISTRIBUTION_MODULES) == extra("server"), (
        "a server dependency changed: update SERVER_DISTRIBUTION_MODULES here and "
        "SERVER_MODULES in coordinator/cli/__init__.py"
    )
    assert set(SERVER_DISTRIBUTION_MODULES.values()) == SERVER_MODULES


def test_dev_installs_both_extras() -> None:
    # `make setup` installs .[dev] only: it must bring the daemon's and the worker's dependencies.
    dev = pyproject()["project"]["optional-dependencies"]["dev"]
    assert "rallypoint[server,worker]" in dev
