"""``python -m collectives.run``: the launcher, ``collectives-run`` (collectives/launcher/)."""
import sys

from .launcher.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
