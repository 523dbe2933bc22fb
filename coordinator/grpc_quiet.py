"""Keep gRPC's own log lines out of the ``rallypoint`` client commands' output.

gRPC's core writes to stderr by itself (a failed TLS handshake is an INFO line of OpenSSL's
words), which would break the commands' promise of one line per failure, said in our words.
It reads its level (``GRPC_VERBOSITY``) once, when first imported, so this module is imported
by ``cli.py`` before anything imports grpc. It changes nothing for ``serve`` and ``cluster``
(members keep gRPC's default logging), for a ``GRPC_VERBOSITY`` set by the user, or when the
program is not the ``rallypoint`` command (a test importing the CLI).
"""

from __future__ import annotations

import os
import sys


def _is_client_command(argv: list[str]) -> bool:
    if not argv:
        return False
    program = argv[0]
    command = os.path.basename(program) == "rallypoint" or program.endswith(
        os.path.join("coordinator", "__main__.py")
    )
    return command and argv[1:2] not in (["serve"], ["cluster"])


if _is_client_command(sys.argv):
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
