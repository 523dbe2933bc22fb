"""``python -m rallypoint.coordinator`` runs the ``rallypoint`` command."""

import sys

from .cli import main

sys.exit(main())
