import sys

from .crash_loop import main

sys.exit(main())
