"""log / ancestors / is_ancestor / merge_base / diff against a naive in-memory oracle.

Random histories with forks, merges (two or three parents), rollbacks (a branch moved back
to an ancestor and continued from there) and equal timestamps, stored on the local backend.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from snapshots_store import Manifest, Repository
from snapshots_store.codec import format_timestamp

from .helpers import BASE_TIME

M = 8


@dataclass
class Oracle:
    parents: dict[str, tuple[str, ...]] = field(default_factory=dict)
    manifests: dict[str, Manifest] = field(default_factory=dict)
    heads: dict[str, str] = field(default_factory=dict)

    def ancestors(self, start: str) -> set[str]:
        result = {start}
        for parent in self.parents[start]:
            result |= self.ancestors(parent)
        return result

    def newest_first(self, ids: set[str]) -> list[str]:
        return sorted(ids, key=lambda s: (-_micros(self.manifests[s]), s))

    def merge_bases(self, a: str, b: str) -> list[str]:
        common = self.ancestors(a) & self.ancestors(b)
        best = {c for c in common if not any(c in self.ancestors(d) - {d} for d in common)}
        return self.newest_first(best)

    def first_parent_log(self, start: str) -> list[str]:
        chain = [start]
        while self.parents[chain[-1]]:
            chain.append(self.parents[chain[-1]][0])
        return chain

    def topo_log(self, start: str) -> list[str]:
        remaining = self.ancestors(start)
        order: list[str] = []
        while remaining:
            ready = {
                s for s in remaining if not any(s in self.parents[c] for c in remaining if c != s)
            }
            pick = self.newest_first(ready)[0]
            order.append(pick)
            remaining.remove(pick)
        return order


def _micros(m: Manifest) -> int:
    from snapshots_store.codec import parse_timestamp

    return int((parse_timestamp(m.created_at) - BASE_TIME) / timedelta(microseconds=1))


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[str, ...]]:
    """A list of operations; interpreted against the current branch heads."""
    ops: list[tuple[str, ...]] = [("commit", "main")]
    for _ in range(draw(st.integers(1, 18))):
        kind = draw(st.sampled_from(["commit", "commit", "commit", "fork", "merge", "rollback"]))
        ops.append((kind, draw(st.sampled_from(["main", "b1", "b2", "b3"]))))
    return ops


def _build(repo: Repository, ops: list[tuple[str, ...]], data: st.DataObject) -> Oracle:
    oracle = Oracle()
    chunks = [repo.put_object("chunk", f"chunk-{i}".encode()) for i in range(6)]
    clock = 0
    for kind, branch in ops:
        head = oracle.heads.get(branch)
        if kind == "fork":
            if head is not None or not oracle.manifests:
                kind = "commit"
            else:
                source = data.draw(st.sampled_from(sorted(oracle.manifests)), label="fork source")
                repo.cas_ref(f"heads/{branch}", None, source, reason="fork")
                oracle.heads[branch] = source
                continue
        if kind == "rollback":
            if head is None:
                continue
            target = data.draw(st.sampled_from(sorted(oracle.ancestors(head))), label="rollback")
            repo.cas_ref(f"heads/{branch}", head, target, reason="rollback")
            event("rollback" if target != head else "rollback to head")
            oracle.heads[branch] = target
            continue
        parents: tuple[str, ...] = () if head is None else (head,)
        if kind == "merge" and head is not None:
            others = sorted({h for b, h in oracle.heads.items() if b != branch} - {head})
            if others:
                extra = data.draw(
                    st.lists(st.sampled_from(others), min_size=1, max_size=2, unique=True),
                    label="merge parents",
                )
                parents = (head, *extra)
                event(f"merge of {len(parents)} parents")
        clock += data.draw(st.integers(0, 2), label="clock step")  # 0: equal timestamps
        key_groups = data.draw(
            st.dictionaries(
                st.integers(0, M - 1),
                st.lists(st.sampled_from(chunks), min_size=1, max_size=2),
                max_size=4,
            ),
            label="key groups",
        )
        offsets = data.draw(
            st.dictionaries(
                st.sampled_from(["s1", "s2"]),
                st.dictionaries(st.sampled_from(["0", "1", "10"]), st.integers(0, 50), max_size=2),
                max_size=2,
            ),
            label="offsets",
        )
        m = Manifest(
            branch=branch,
            epoch=len(oracle.manifests),
            parents=parents,
            max_parallelism=M,
            parallelism=1 + clock % M,
            kind="epoch" if parents else "initial",
            key_groups=key_groups,
            offsets=offsets,
            created_at=format_timestamp(BASE_TIME + timedelta(seconds=clock)),
        )
        sid = repo.commit(m, branch, expected_head=head, reason=kind)
        oracle.parents[sid] = parents
        oracle.manifests[sid] = m
        oracle.heads[branch] = sid
    return oracle


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=histories(), data=st.data())
def test_graph_walks_and_diff_match_the_oracle(
    tmp_path: Path, ops: list[tuple[str, ...]], data: st.DataObject
) -> None:
    repo = Repository.open((tmp_path / uuid.uuid4().hex).as_uri(), "app")
    oracle = _build(repo, ops, data)
    ids = sorted(oracle.manifests)
    for branch, head in oracle.heads.items():
        assert repo.resolve(branch) == head
        assert [s for s, _ in repo.log(branch, first_parent=True)] == oracle.first_parent_log(head)
        full = [s for s, _ in repo.log(branch)]
        assert full == oracle.topo_log(head)
        assert set(full) == repo.ancestors(branch) == oracle.ancestors(head)
        assert [s for s, _ in repo.log(branch, limit=3)] == full[:3]
    for _ in range(6):
        a = data.draw(st.sampled_from(ids), label="a")
        b = data.draw(st.sampled_from(ids), label="b")
        assert repo.is_ancestor(a, b) == (a in oracle.ancestors(b))
        assert repo.merge_bases(a, b) == oracle.merge_bases(a, b)
        expected = oracle.merge_bases(a, b)
        assert repo.merge_base(a, b) == (expected[0] if expected else None)
        assert repo.merge_base(a, b) == repo.merge_base(b, a)
        _check_diff(repo, oracle, a, b)


def _naive_diff(
    old: Manifest, new: Manifest
) -> tuple[set[int], set[int], set[int], dict[tuple[str, str], int]]:
    added = {g for g in new.key_groups if g not in old.key_groups}
    removed = {g for g in old.key_groups if g not in new.key_groups}
    changed = {
        g
        for g in old.key_groups
        if g in new.key_groups and tuple(old.key_groups[g]) != tuple(new.key_groups[g])
    }
    offsets: dict[tuple[str, str], int] = {}
    for source in set(old.offsets) | set(new.offsets):
        for part in set(old.offsets.get(source, {})) | set(new.offsets.get(source, {})):
            a = old.offsets.get(source, {}).get(part)
            b = new.offsets.get(source, {}).get(part)
            if a != b:
                offsets[(source, part)] = (b or 0) - (a or 0)
    return added, changed, removed, offsets


def _check_diff(repo: Repository, oracle: Oracle, a: str, b: str) -> None:
    d = repo.diff(a, b)
    added, changed, removed, offsets = _naive_diff(oracle.manifests[a], oracle.manifests[b])
    assert {c.key_group for c in d.added} == added
    assert {c.key_group for c in d.changed} == changed
    assert {c.key_group for c in d.removed} == removed
    assert {(o.source, o.partition): o.advanced for o in d.offsets} == offsets
    for change in (*d.added, *d.changed, *d.removed):
        for chunks, size in (
            (change.old_chunks, change.old_size),
            (change.new_chunks, change.new_size),
        ):
            infos = [repo.objects.stat(c) for c in chunks]
            assert size == sum(info.size for info in infos if info is not None)
    assert repo.diff(a, a).empty
