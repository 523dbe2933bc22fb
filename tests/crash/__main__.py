import sys

from rallypoint.worker.process_tree import run_reaped

from .crash_loop import main

sys.exit(run_reaped(main))
