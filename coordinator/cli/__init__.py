"""The ``rallypoint`` command line: the daemon's commands (serve, cluster up, secret) and
the client commands (kv, lease, jobs, rounds, status...)."""

from .main import main

__all__ = ["main"]
