"""``python -m fxviews``: the command line of :mod:`fxviews.cli`."""

import sys

from fxviews.cli import main

if __name__ == "__main__":
    sys.exit(main())
