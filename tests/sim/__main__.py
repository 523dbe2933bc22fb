"""``python -m tests.sim --seeds N`` (or ``--seed S --trace``): see README.md."""

import sys

from rallypoint.worker.process_tree import run_reaped

from .runner import main

sys.exit(run_reaped(main))
