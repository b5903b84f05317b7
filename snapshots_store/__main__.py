"""``python -m snapshots_store``: see `snapshots_store.cli`."""

from snapshots_store.cli import main

raise SystemExit(main())
