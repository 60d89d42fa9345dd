"""``python -m fxviews.bench``: the bench command on its own."""

from fxviews.bench.cli import main

raise SystemExit(main())
