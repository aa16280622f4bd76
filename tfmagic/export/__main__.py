"""``python -m tfmagic.export``: the same command line as ``tfmagic export``, kept for old instructions."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
