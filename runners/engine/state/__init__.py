"""The engine's state layer, one room per concern:

- `keyed` — the keyed state a per-key function sees (value, list and map states, TTL) and
  its epoch context; re-exported here: ``from runners.engine.state import KeyedState``.
- `timers` — a per-key function's event-time and processing-time timers (`ctx.timers`).
- `codec` — a key group's chunks as bytes and tables: encoding, base + deltas, materialising.
- `memory_cache` / `disk_cache` — materialised chains in the worker's memory and on the
  machine's disk, keyed by their chunk ids.
- `restore` — reading key groups from the store into the caches: one key group, a task's
  key groups at once, and the restore stage's claimed batches.
- `writer` — the one chunk writer (STARTED -> PREPARED -> COMPLETE / FAILED) used by the
  epoch's tasks and by the state operations.
"""

from runners.engine.state.keyed import (
    EpochContext,
    KeyedState,
    ListState,
    MapState,
    ValueState,
    epoch_seed,
)

__all__ = ["EpochContext", "KeyedState", "ListState", "MapState", "ValueState", "epoch_seed"]
