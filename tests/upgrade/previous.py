"""The previous release, built from a pinned commit of this repository, to run beside this one.

``extract`` takes the commit's tree out of git (``git archive``; CI's checkout is a full
clone, so the commit is there) into a scratch folder and lays out the import package
``rallypoint`` over its top-level folders, as ``make setup``'s ``.pkgview`` does. Its members
run with this interpreter and this environment's installed dependencies, but none of this
checkout's code: ``python -S`` skips the site hooks (the editable install's path finder would
map ``rallypoint`` to this checkout), and ``PYTHONPATH`` names the extracted view first, then
the environment's site-packages. The pinned commit predates every change since, so the
dependencies it needs (grpcio, protobuf, msgpack, uvloop, google-crc32c) are the same ones.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# The first release that speaks the stream peer protocol (docs/peer-protocol.md), with
# ``RALLYPOINT_PEER_TRANSPORT=stream``: this build speaks nothing else on the peer port, so an
# older release (gRPC there) cannot share a cluster with it.
PINNED_COMMIT = "f771d74"
# Its record version (coordinator/version.py there).
PINNED_RECORD_VERSION = 2
# Its peer transport, set for its members (its default was grpc).
PINNED_ENV = (("RALLYPOINT_PEER_TRANSPORT", "stream"),)
REPOSITORY = Path(__file__).resolve().parents[2]
PACKAGES = ("raft", "coordinator", "client", "worker", "proto")


class PreviousBuildError(RuntimeError):
    """The pinned commit cannot be extracted (a shallow clone, no git)."""


@dataclass(frozen=True)
class Build:
    """How to start a member of another build: what replaces ``python -m
    rallypoint.coordinator`` in its command, and the environment it needs."""

    name: str
    interpreter: tuple[str, ...]
    env: tuple[tuple[str, str], ...]


def source_dir(commit: str, scratch: Path) -> Path:
    """Where ``extract`` puts the tree of ``commit`` under ``scratch``."""
    return scratch / f"rallypoint-{commit}"


def extract(commit: str, scratch: Path) -> Build:
    """The tree of ``commit`` under ``scratch``, ready to run (done once per scratch)."""
    source = source_dir(commit, scratch)
    view = source / ".view"
    if not (view / "rallypoint").is_dir():
        source.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(REPOSITORY), "archive", "--format=tar", commit],
            capture_output=True,
            check=False,
        )
        if archive.returncode != 0:
            raise PreviousBuildError(
                f"cannot extract commit {commit} of {REPOSITORY}: "
                f"{archive.stderr.decode(errors='replace').strip()} (the upgrade test needs a "
                "full clone: git fetch --unshallow)"
            )
        subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
        (view / "rallypoint").mkdir(parents=True)
        for package in PACKAGES:
            (view / "rallypoint" / package).symlink_to(source / package)
    paths = dict.fromkeys(
        [str(view), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    )
    return Build(
        name=commit,
        interpreter=(sys.executable, "-S", "-m", "rallypoint.coordinator"),
        env=(("PYTHONPATH", ":".join(paths)), *PINNED_ENV),
    )
