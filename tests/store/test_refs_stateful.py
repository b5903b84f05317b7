"""Refs, reflog, deletion, pruning and gc as a state machine against a plain model."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from snapshots_store import RefConflictError, Repository, check_repository, collect_garbage

from .helpers import manifest

REFS = ["heads/main", "heads/dev", "tags/save"]


@dataclass
class ModelEntry:
    seq: int
    old: str | None
    new: str | None
    at: datetime


class RefMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp()
        self.now = datetime(2026, 1, 1, tzinfo=UTC)
        self.repo = Repository.open(f"file://{self.root}", "app", clock=lambda: self.now)
        self.snapshots: list[str] = []
        self.targets: dict[str, str | None] = {}
        self.logs: dict[str, list[ModelEntry]] = {}
        self.first_kept: dict[str, int] = {}

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def _record(self, ref: str, old: str | None, new: str | None) -> None:
        entries = self.logs.setdefault(ref, [])
        entries.append(ModelEntry(len(entries) + 1, old, new, self.now))
        self.first_kept.setdefault(ref, 1)
        self.targets[ref] = new

    @rule()
    def make_snapshot(self) -> None:
        parents = (self.snapshots[-1],) if self.snapshots else ()
        m = manifest(epoch=len(self.snapshots), parents=parents)
        self.snapshots.append(self.repo.write_manifest(m))

    @precondition(lambda self: self.snapshots)
    @rule(ref=st.sampled_from(REFS), data=st.data())
    def move(self, ref: str, data: st.DataObject) -> None:
        new = data.draw(st.sampled_from(self.snapshots))
        old = self.targets.get(ref)
        self.repo.cas_ref(ref, old, new, reason="move")
        self._record(ref, old, new)

    @precondition(lambda self: self.snapshots)
    @rule(ref=st.sampled_from(REFS), data=st.data())
    def stale_move_is_refused(self, ref: str, data: st.DataObject) -> None:
        current = self.targets.get(ref)
        stale = data.draw(st.sampled_from([None, *self.snapshots]))
        if stale == current:
            return
        with pytest.raises(RefConflictError):
            self.repo.cas_ref(ref, stale, self.snapshots[-1], reason="stale")

    @rule(ref=st.sampled_from(REFS))
    def delete(self, ref: str) -> None:
        current = self.targets.get(ref)
        if current is None:
            return
        self.repo.delete_ref(ref, current, reason="delete")
        self._record(ref, current, None)

    @rule(hours=st.integers(1, 72))
    def time_passes(self, hours: int) -> None:
        self.now += timedelta(hours=hours)

    @rule(retention_hours=st.integers(0, 96))
    def gc(self, retention_hours: int) -> None:
        cutoff = self.now - timedelta(hours=retention_hours)
        collect_garbage(
            self.repo, retention=timedelta(hours=retention_hours), grace=timedelta(hours=1)
        )
        for ref, entries in self.logs.items():
            kept = self.first_kept[ref]
            while kept < len(entries) and entries[kept - 1].at < cutoff:
                kept += 1
            self.first_kept[ref] = kept

    @invariant()
    def refs_match_the_model(self) -> None:
        live = {ref: t for ref, t in self.targets.items() if t is not None}
        assert {n: v.target for n, v in self.repo.list_refs().items()} == live
        for ref, entries in self.logs.items():
            value = self.repo.read_ref(ref)
            assert (None if value is None else value.target) == self.targets[ref]
            if value is not None:
                assert value.seq == len(entries)
            log = self.repo.reflog(ref)
            expected = entries[self.first_kept[ref] - 1 :]
            assert [(e.seq, e.old, e.new) for e in log] == [(e.seq, e.old, e.new) for e in expected]

    @invariant()
    def store_is_sound(self) -> None:
        assert check_repository(self.repo).ok


TestRefMachine = RefMachine.TestCase
TestRefMachine.settings = settings(
    max_examples=15,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
