"""``python -m collectives.launcher``: the same as ``collectives-run``."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
