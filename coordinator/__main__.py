"""``python -m rallypoint.coordinator`` runs the ``rallypoint`` command."""

import sys

from .cli.main import main

sys.exit(main())
