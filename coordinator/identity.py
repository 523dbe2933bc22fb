"""A data directory's identity: whose it is, which life of it this is, and whether it votes.

Theory of operation. Raft's safety rests on stable storage: a member that forgets its log
or its vote can vote twice in a term, or help elect a leader that lacks entries it had
acknowledged. So a data directory records (``identity.json``, written atomically):

- the cluster id and member id it belongs to: a member started with flags that name another
  cluster or member is refused, with both named;
- an *incarnation*, a random number made whenever the member starts from empty storage: its
  peers see it in every message and log when a member comes back as a new incarnation;
- ``abstaining``: set when the member starts from empty storage into a cluster that already
  exists (its data was lost, or it is joining): it does not vote or campaign until its log
  holds an entry of the current leader's term at the commit index, which proves it holds
  every committed entry; cleared (and written) then;
- ``boots``, incremented at every start: proposal ids are unique across restarts because
  they begin with it.

Whether a cluster "already exists" is asked of the other members (``Hello`` on the peer port)
before a member creates the cluster from empty storage; see ``Node.start``.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass, replace
from typing import Any

FORMAT = 1
FILE_NAME = "identity.json"


class IdentityError(ValueError):
    """A data directory that does not belong to this member, or cannot be read."""


@dataclass(frozen=True, slots=True)
class Identity:
    cluster_id: int
    member_id: int
    # Random, never 0; a new one whenever the member starts from empty storage.
    incarnation: int
    abstaining: bool = False
    # Starts so far, this one included once ``started`` was called.
    boots: int = 0

    @staticmethod
    def new(cluster_id: int, member_id: int, *, abstaining: bool, boots: int = 0) -> Identity:
        return Identity(cluster_id, member_id, secrets.randbits(63) | 1, abstaining, boots)

    def started(self) -> Identity:
        return replace(self, boots=self.boots + 1)

    def to_json(self) -> dict[str, Any]:
        fields = asdict(self)
        fields["cluster_id"] = f"{self.cluster_id:016x}"
        fields["incarnation"] = f"{self.incarnation:016x}"
        return {"format": FORMAT, **fields}

    @staticmethod
    def from_json(raw: Any, path: str) -> Identity:
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            found = raw.get("format") if isinstance(raw, dict) else None
            raise IdentityError(
                f"{path}: unknown identity format {found!r} (this version reads {FORMAT})"
            )
        try:
            return Identity(
                cluster_id=int(raw["cluster_id"], 16),
                member_id=int(raw["member_id"]),
                incarnation=int(raw["incarnation"], 16),
                abstaining=bool(raw["abstaining"]),
                boots=int(raw["boots"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise IdentityError(f"{path}: malformed identity ({exc!r})") from None


def path_in(data_dir: str) -> str:
    return os.path.join(data_dir, FILE_NAME)


def load(data_dir: str) -> Identity | None:
    path = path_in(data_dir)
    try:
        with open(path, "rb") as f:
            raw = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise IdentityError(f"{path}: cannot read the identity ({exc})") from None
    return Identity.from_json(raw, path)


def save(data_dir: str, identity: Identity) -> None:
    """Write atomically and durably: temp file, fsync, rename, fsync the directory."""
    path = path_in(data_dir)
    temporary = path + ".tmp"
    data = json.dumps(identity.to_json(), indent=2).encode() + b"\n"
    with open(temporary, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
    directory = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def check(identity: Identity, cluster_id: int, member_id: int, data_dir: str) -> None:
    """Refuse a data directory made for another cluster or member, naming both."""
    if identity.member_id != member_id:
        raise IdentityError(
            f"data dir {data_dir} belongs to member {identity.member_id}, but this member was "
            f"started as member {member_id}: check --member-id and --data-dir"
        )
    if identity.cluster_id != cluster_id:
        raise IdentityError(
            f"data dir {data_dir} belongs to cluster {identity.cluster_id:016x}, but the "
            f"peer secret and --cluster-token given make cluster {cluster_id:016x}: check "
            "--peer-secret-file and --cluster-token (or --data-dir)"
        )
