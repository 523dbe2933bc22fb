"""The ``rallypoint`` command line: the daemon's commands (serve, cluster up, secret) and
the client commands (kv, lease, jobs, rounds, status...).

The command is part of the ``[server]`` extra: ``serve`` needs the daemon's dependencies and
the client commands draw their tables with rich, which is one of them. The console script is
installed by every install, though, so in the base install (the client library alone) every
command prints one line naming the extra to install and exits 1, instead of a traceback from
the first missing import. Only a missing *server* dependency is reported so; any other import
error is a bug and propagates.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

# The top-level modules `pip install 'rallypoint[server]'` adds to the base install: one per
# distribution of pyproject.toml's server extra (tests/packaging checks the two agree).
SERVER_MODULES = frozenset({"grpc_health", "uvloop", "google_crc32c", "prometheus_client", "rich"})
SERVER_EXTRA_HINT = "pip install 'rallypoint[server]'"

try:
    from .main import main
except ModuleNotFoundError as exc:
    if (exc.name or "").partition(".")[0] not in SERVER_MODULES:
        raise
    _missing = exc.name

    def main(argv: Sequence[str] | None = None) -> int:
        print(
            f"rallypoint: the command line needs the server extra ({_missing} is not "
            f"installed): {SERVER_EXTRA_HINT}",
            file=sys.stderr,
        )
        return 1


__all__ = ["SERVER_EXTRA_HINT", "SERVER_MODULES", "main"]
