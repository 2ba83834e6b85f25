"""``python -m octopus.bench.serving``."""

import sys

from .cli import main

sys.exit(main())
