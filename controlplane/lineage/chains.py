"""Placement of new snapshots on chains, with generation numbers (pure, no database).

Snapshots arrive parents first. Each gets `generation = 1 + max(parent generations)` (1 for a
root) and a chain: it extends its first parent's chain when that parent is the chain's tip,
otherwise it opens a new chain. Chain edges record how chains hang together (see models.py).
The same code places snapshots for the services and for the benchmark's bulk loader.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Edge:
    """From a snapshot at (from_chain, from_generation) to a parent at (to_chain, to_generation)."""

    from_chain: int
    from_generation: int
    to_chain: int
    to_generation: int
    first_parent: bool


@dataclass(frozen=True)
class Placement:
    chain: int
    generation: int
    opens_chain: bool
    edges: tuple[Edge, ...]


@dataclass
class ChainPlanner:
    """Places snapshots one by one; seed it with the places of already indexed parents.

    `new_chain()` hands out ids for new chains; `places` maps snapshot key -> (chain, generation)
    and `tips` maps chain -> tip generation, for every chain a new snapshot may touch.
    """

    new_chain: Callable[[], int]
    places: dict[Hashable, tuple[int, int]] = field(default_factory=dict)
    tips: dict[int, int] = field(default_factory=dict)

    def place(self, key: Hashable, parents: Sequence[Hashable]) -> Placement:
        parent_places = [self.places[p] for p in parents]
        generation = 1 + max((g for _, g in parent_places), default=0)
        edges: list[Edge] = []
        if parent_places and self.tips.get(parent_places[0][0]) == parent_places[0][1]:
            chain, opens = parent_places[0][0], False
        else:
            chain, opens = self.new_chain(), True
        for position, (p_chain, p_generation) in enumerate(parent_places):
            if position == 0 and not opens:
                continue
            edges.append(Edge(chain, generation, p_chain, p_generation, position == 0))
        self.tips[chain] = generation
        self.places[key] = (chain, generation)
        return Placement(chain, generation, opens, tuple(edges))
