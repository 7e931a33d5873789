"""``python -m orchard_async.images build ...``: ``orchard-async images build`` for scripts that run
before the CLI is wired."""

import sys

from orchard_async.images.build import main

sys.exit(main())
