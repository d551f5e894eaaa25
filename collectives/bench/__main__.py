"""``python -m collectives.bench``: the collectives-bench command."""
import sys

from .driver import main

sys.exit(main())
