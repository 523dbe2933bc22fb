"""``python -m tests.sim --seeds N`` (or ``--seed S --trace``): see README.md."""

import sys

from .runner import main

sys.exit(main())
