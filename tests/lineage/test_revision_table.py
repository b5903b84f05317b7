"""One table of revisions, answered alike by every user of the one revision grammar
(`snapshots_store.revisions`): the store's `Repository.resolve`, the lineage index's SQL, the
API's validators — and by `git rev-parse` on a git repository with the same commit shape.

The shape (c1 oldest)::

    main:  c1 - c2 - c3 - m4 - c5        m4 merges e2 (parents: c3, e2)
    exp:         \\- e1 - e2              tag v1 -> c3

A row is (revision, the snapshot it names or None, whether the text is a revision at all).
``{c3}`` stands for c3's id and ``{c3:10}`` for its first 10 hex digits, in each world.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from controlplane.applications.models import Application
from controlplane.errors import InvalidRequest
from controlplane.lineage import selectors
from controlplane.lineage.errors import UnknownRevisionError as IndexUnknownRevision
from controlplane.lineage.services import reindex_application
from controlplane.operations.params import check_params
from controlplane.refnames import checked_revision
from snapshots_store import Repository
from snapshots_store.errors import InvalidRevisionError, UnknownRevisionError
from snapshots_store.revisions import MAX_COUNT
from tests.store.helpers import manifest

PARENTS: dict[str, tuple[str, ...]] = {
    "c1": (),
    "c2": ("c1",),
    "c3": ("c2",),
    "e1": ("c2",),
    "e2": ("e1",),
    "m4": ("c3", "e2"),
    "c5": ("m4",),
}
REFS = {"heads/main": "c5", "heads/exp": "e2", "tags/v1": "c3"}

TABLE: list[tuple[str, str | None, bool]] = [
    ("main", "c5", True),
    ("heads/main", "c5", True),
    ("refs/heads/main", "c5", True),
    ("exp", "e2", True),
    ("v1", "c3", True),
    ("tags/v1", "c3", True),
    ("main^0", "c5", True),
    ("main~0", "c5", True),
    ("main~000", "c5", True),
    ("v1^0", "c3", True),
    ("main^", "m4", True),
    ("main~", "m4", True),
    ("main^1", "m4", True),
    ("main~01", "m4", True),
    ("main~2", "c3", True),
    ("main~1^2", "e2", True),
    ("main^^2", "e2", True),
    ("main~1^2~1", "e1", True),
    ("main~1^2~", "e1", True),
    ("main~1^2~2", "c2", True),
    ("main~1^0~1", "c3", True),
    ("main~4", "c1", True),
    ("main^^^^", "c1", True),
    ("exp~2", "c2", True),
    ("{c3}", "c3", True),
    ("{c3}~1", "c2", True),
    ("{m4:10}^2", "e2", True),
    ("{c5:8}", "c5", True),
    # revisions that name no snapshot
    ("main~5", None, True),
    ("main~4^", None, True),
    ("main^2", None, True),
    ("main~1^3", None, True),
    ("v1~9", None, True),
    ("nosuch", None, True),
    ("tags/main", None, True),
    (f"main~{MAX_COUNT}", None, True),
    # texts that are no revision
    ("", None, False),
    ("main~1\n", None, False),
    ("main\n", None, False),
    (" main", None, False),
    ("main~1 ", None, False),
    ("main\t", None, False),
    ("main~\u0663", None, False),  # ARABIC-INDIC DIGIT THREE
    ("main^\u0662", None, False),
    ("main~1x", None, False),
    ("main~-1", None, False),
    ("~1", None, False),
    ("^", None, False),
    (f"main~{MAX_COUNT + 1}", None, False),
    ("main~" + "9" * 5000, None, False),
    ("ma in", None, False),
    ("main:x", None, False),
]


@dataclass
class World:
    ids: dict[str, str]

    def text(self, rev: str) -> str:
        return re.sub(
            r"\{(\w+)(?::(\d+))?\}",
            lambda m: self.ids[m.group(1)][: int(m.group(2) or 64)],
            rev,
        )

    def label(self, snapshot_id: str) -> str:
        return {v: k for k, v in self.ids.items()}[snapshot_id]


def _store_world(repo: Repository) -> World:
    ids: dict[str, str] = {}
    for epoch, (label, parents) in enumerate(PARENTS.items()):
        branch = "exp" if label.startswith("e") else "main"
        ids[label] = repo.write_manifest(
            manifest(branch=branch, epoch=epoch, parents=tuple(ids[p] for p in parents))
        )
    for ref, label in REFS.items():
        repo.cas_ref(ref, None, ids[label], reason="revision table")
    return World(ids)


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": str(root),
    }
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, env=env, check=False
    )


def _git_world(root: Path) -> World:
    _git(root, "init", "-q").check_returncode()
    tree = _git(root, "hash-object", "-t", "tree", "-w", "/dev/null").stdout.strip()
    ids: dict[str, str] = {}
    for label, parents in PARENTS.items():
        args = [arg for p in parents for arg in ("-p", ids[p])]
        made = _git(root, "commit-tree", tree, *args, "-m", label)
        made.check_returncode()
        ids[label] = made.stdout.strip()
    for ref, label in REFS.items():
        _git(root, "update-ref", f"refs/{ref}", ids[label]).check_returncode()
    return World(ids)


@pytest.fixture
def worlds(tmp_path: Path, repo: Repository, application: Application) -> dict[str, World]:
    store = _store_world(repo)
    reindex_application(application=application, repo=repo)
    (tmp_path / "git").mkdir()
    return {"store": store, "git": _git_world(tmp_path / "git")}


def _store_answer(repo: Repository, world: World, rev: str) -> str | None:
    try:
        return world.label(repo.resolve(world.text(rev)))
    except UnknownRevisionError:
        return None


def _index_answer(application: Application, world: World, rev: str) -> str | None:
    try:
        found = selectors.snapshot_get(application=application, rev=world.text(rev))
    except IndexUnknownRevision:
        return None
    return world.label(found.snapshot_id)


def _git_answer(root: Path, world: World, rev: str) -> str | None:
    answer = _git(root, "rev-parse", "--verify", "-q", "--end-of-options", world.text(rev))
    return world.label(answer.stdout.strip()) if answer.returncode == 0 else None


def _api_accepts(world: World, rev: str) -> bool:
    """Both API validators (a query parameter, an operation's parameter) agree."""
    text = world.text(rev)
    try:
        checked_revision(text, field="against")
        query = True
    except InvalidRequest as exc:
        assert list(exc.fields) == ["against"], exc.fields
        query = False
    try:
        check_params("rollback", {"to": text})
        params = True
    except InvalidRequest as exc:
        assert list(exc.fields) == ["to"], exc.fields
        assert "not a revision" in exc.fields["to"][0] or text == ""
        params = False
    assert query == params, (rev, query, params)
    return query


def test_every_user_of_the_grammar_answers_the_table_as_git_does(
    worlds: dict[str, World], repo: Repository, application: Application, tmp_path: Path
) -> None:
    answers = {
        rev: (
            _store_answer(repo, worlds["store"], rev),
            _index_answer(application, worlds["store"], rev),
            _git_answer(tmp_path / "git", worlds["git"], rev),
            _api_accepts(worlds["store"], rev),
        )
        for rev, _, _ in TABLE
    }
    expected = {rev: (label, label, label, valid) for rev, label, valid in TABLE}
    wrong = {rev: answers[rev] for rev in answers if answers[rev] != expected[rev]}
    assert not wrong, f"(store, index, git, api) differ from the table: {wrong}"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("main~1\n", "'\\n' is not part of a revision"),
        ("main~\u0663", "a count is ASCII digits 0-9"),
        (f"main~{MAX_COUNT + 1}", f"above {MAX_COUNT}"),
        ("main~" + "9" * 500, f"above {MAX_COUNT}"),
        ("main~" + "9" * 5000, "longer than 1000 characters"),
    ],
)
def test_a_text_that_is_no_revision_is_refused_saying_why(
    repo: Repository, text: str, says: str
) -> None:
    with pytest.raises(InvalidRevisionError) as refused:
        repo.resolve(text)
    assert says in str(refused.value)
    with pytest.raises(InvalidRequest) as invalid:
        check_params("rollback", {"to": text})
    assert says in invalid.value.fields["to"][0]
