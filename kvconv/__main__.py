"""``python -m kvconv``: the same as the ``kvconv`` command."""
from .cli import main

raise SystemExit(main())
