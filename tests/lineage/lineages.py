"""Random lineages for the lineage-index tests, and a naive in-memory oracle.

A lineage is built from a script of steps — commit on a branch, fork a new branch from any
snapshot, roll a branch back to an ancestor of its head, merge another branch's head in —
with strictly increasing `created_at` except for deliberate ties. The oracle answers every
question by brute force over the parent map.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache

from hypothesis import strategies as st

from snapshots_store import Manifest
from snapshots_store.codec import format_timestamp
from snapshots_store.objects import object_id

BASE_TIME = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Step:
    action: str  # commit | fork | rollback | merge
    branch: int
    pick: int  # which snapshot / how far back / which other branch


@dataclass
class Lineage:
    """Snapshots in commit order, branch heads, and the moves made (ref, old, new)."""

    order: list[str] = field(default_factory=list)
    manifests: dict[str, Manifest] = field(default_factory=dict)
    heads: dict[str, str] = field(default_factory=dict)
    moves: list[tuple[str, str | None, str]] = field(default_factory=list)

    def parents(self, sid: str) -> tuple[str, ...]:
        return self.manifests[sid].parents


def build(
    steps: list[Step],
    *,
    on_commit: Callable[[str, Manifest], str] | None = None,
    on_move: Callable[[str, str, str], None] | None = None,
) -> Lineage:
    """Play `steps`. `on_commit(branch, manifest) -> id` and `on_move(branch, old, new)` let a
    caller commit into a real store as the lineage grows (ids then come from the store)."""
    lineage = Lineage()
    tick = 0

    def commit(branch: str, parents: tuple[str, ...], kind: str) -> str:
        nonlocal tick
        tick += 1
        first = lineage.manifests[parents[0]] if parents else None
        manifest = Manifest(
            branch=branch,
            epoch=first.epoch + 1 if first else 0,
            parents=parents,
            max_parallelism=8,
            parallelism=2,
            kind=kind,
            offsets={"src": {"0": tick * 10}},
            stats={"records_in": tick},
            provenance={"source": parents[0]} if kind == "fork" else {},
            # every 7th commit shares its timestamp with the previous one (ties by id)
            created_at=format_timestamp(BASE_TIME + timedelta(seconds=tick - (tick % 7 == 0))),
        )
        if on_commit is not None:
            sid = on_commit(branch, manifest)
        else:
            sid = object_id("manifest", manifest.to_bytes())
        lineage.manifests[sid] = manifest
        lineage.order.append(sid)
        lineage.moves.append((branch, lineage.heads.get(branch), sid))
        lineage.heads[branch] = sid
        return sid

    commit("main", (), "initial")
    for step in steps:
        names = sorted(lineage.heads)
        branch = names[step.branch % len(names)]
        head = lineage.heads[branch]
        if step.action == "commit":
            commit(branch, (head,), "epoch")
        elif step.action == "fork":
            source = lineage.order[step.pick % len(lineage.order)]
            commit(f"b{len(names)}", (source,), "fork")
        elif step.action == "rollback":
            target = head
            for _ in range(1 + step.pick % 4):
                parents = lineage.parents(target)
                target = parents[0] if parents else target
            if target != head:
                if on_move is not None:
                    on_move(branch, head, target)
                lineage.moves.append((branch, head, target))
                lineage.heads[branch] = target
        elif step.action == "merge":
            other = lineage.heads[names[step.pick % len(names)]]
            if other != head:
                commit(branch, (head, other), "epoch")
    return lineage


steps_strategy = st.lists(
    st.builds(
        Step,
        st.sampled_from(["commit"] * 5 + ["fork"] * 2 + ["rollback", "merge"]),
        st.integers(0, 9),
        st.integers(0, 200),
    ),
    min_size=0,
    max_size=40,
)


class Oracle:
    """Brute-force answers over a lineage's parent map."""

    def __init__(self, lineage: Lineage) -> None:
        self.lineage = lineage
        self.parents = {sid: m.parents for sid, m in lineage.manifests.items()}

        @cache
        def generation(sid: str) -> int:
            return 1 + max((generation(p) for p in self.parents[sid]), default=0)

        @cache
        def ancestors(sid: str) -> frozenset[str]:
            result = {sid}
            for parent in self.parents[sid]:
                result |= ancestors(parent)
            return frozenset(result)

        self.generation = generation
        self.ancestors = ancestors

    def topo(self, sid: str) -> list[str]:
        """Full log order: generation descending, then id."""
        return sorted(self.ancestors(sid), key=lambda s: (-self.generation(s), s))

    def first_parent(self, sid: str) -> list[str]:
        result = [sid]
        while self.parents[result[-1]]:
            result.append(self.parents[result[-1]][0])
        return result

    def merge_bases(self, a: str, b: str) -> list[str]:
        common = self.ancestors(a) & self.ancestors(b)
        best = {c for c in common if not any(c in self.ancestors(o) for o in common - {c})}
        manifests = self.lineage.manifests
        return sorted(best, key=lambda s: (-_micros(manifests[s].created_at), s))


def _micros(stamp: str) -> int:
    from snapshots_store.codec import parse_timestamp

    return int(parse_timestamp(stamp).timestamp() * 1_000_000)
