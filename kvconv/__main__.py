"""``python -m kvconv``: the same as the ``kvconv`` command."""
from kvconv.cli import main

raise SystemExit(main())
