"""Key groups: the unit of state redistribution, after Flink's ``KeyGroupRangeAssignment``.

``kg(k) = murmur3_x86_32(canonical_bytes(k), seed=0) mod M`` (unsigned). With parallelism p,
task i owns the contiguous range ``ceil(i*M/p) .. floor(((i+1)*M-1)/p)`` and key group g
belongs to task ``floor(g*p/M)``. Exact integer arithmetic only.
"""

from __future__ import annotations

from dataclasses import dataclass

import mmh3
import numpy as np
import numpy.typing as npt

from runners.engine.keys import canonical_bytes

IntArray = npt.NDArray[np.int64]

#: Upper bound of the max parallelism M (as in Flink: 2**15).
UPPER_BOUND_MAX_PARALLELISM = 32768
DEFAULT_MAX_PARALLELISM = 128


class KeyGroupError(ValueError):
    """Parallelism or max parallelism outside what a lineage allows."""


@dataclass(frozen=True)
class KeyGroupRange:
    """Key groups ``start .. end`` inclusive (empty when end < start)."""

    start: int
    end: int

    def __contains__(self, key_group: object) -> bool:
        return isinstance(key_group, int) and self.start <= key_group <= self.end

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(self.start, self.end + 1))

    def __len__(self) -> int:
        return max(0, self.end - self.start + 1)


def check_max_parallelism(max_parallelism: int) -> int:
    """M must lie in 1..32768."""
    if isinstance(max_parallelism, bool) or not isinstance(max_parallelism, int):
        raise KeyGroupError(f"max parallelism must be an int, not {max_parallelism!r}")
    if not 1 <= max_parallelism <= UPPER_BOUND_MAX_PARALLELISM:
        raise KeyGroupError(
            f"max parallelism {max_parallelism} is outside 1..{UPPER_BOUND_MAX_PARALLELISM}"
        )
    return max_parallelism


def check_parallelism(parallelism: int, max_parallelism: int) -> int:
    """p must lie in 1..M: a task without a key group could never hold state."""
    check_max_parallelism(max_parallelism)
    if isinstance(parallelism, bool) or not isinstance(parallelism, int):
        raise KeyGroupError(f"parallelism must be an int, not {parallelism!r}")
    if parallelism < 1:
        raise KeyGroupError(f"parallelism {parallelism} must be at least 1")
    if parallelism > max_parallelism:
        raise KeyGroupError(
            f"parallelism {parallelism} exceeds the lineage's max parallelism {max_parallelism}; "
            "changing M is an explicit rehash migration"
        )
    return parallelism


def hash_key(key: object) -> int:
    """murmur3_x86_32 (seed 0, unsigned) of the key's canonical bytes."""
    return int(mmh3.hash(canonical_bytes(key), 0, signed=False))


def key_group_of(key: object, max_parallelism: int) -> int:
    """The key group of a key: its hash modulo M."""
    return hash_key(key) % check_max_parallelism(max_parallelism)


def key_group_range(task: int, parallelism: int, max_parallelism: int) -> KeyGroupRange:
    """Key groups owned by `task` (0-based) at parallelism p.

    ``ceil(i*M/p) .. floor(((i+1)*M-1)/p)``."""
    check_parallelism(parallelism, max_parallelism)
    if not 0 <= task < parallelism:
        raise KeyGroupError(f"task {task} is outside 0..{parallelism - 1}")
    start = (task * max_parallelism + parallelism - 1) // parallelism
    end = ((task + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange(start, end)


def operator_index(key_group: int, parallelism: int, max_parallelism: int) -> int:
    """The task owning key group g at parallelism p: floor(g*p/M)."""
    check_parallelism(parallelism, max_parallelism)
    if not 0 <= key_group < max_parallelism:
        raise KeyGroupError(f"key group {key_group} is outside 0..{max_parallelism - 1}")
    return key_group * parallelism // max_parallelism


def range_bounds(parallelism: int, max_parallelism: int) -> tuple[IntArray, IntArray]:
    """(starts, ends) of all p tasks' ranges as arrays, in task order (vectorised)."""
    check_parallelism(parallelism, max_parallelism)
    p, m = parallelism, max_parallelism
    tasks = np.arange(p, dtype=np.int64)
    return (tasks * m + p - 1) // p, ((tasks + 1) * m - 1) // p


def key_group_ranges(parallelism: int, max_parallelism: int) -> list[KeyGroupRange]:
    """The ranges of all p tasks, in task order."""
    starts, ends = range_bounds(parallelism, max_parallelism)
    return [KeyGroupRange(a, b) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
