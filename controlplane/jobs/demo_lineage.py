"""A demonstration lineage for an empty store: what the control plane shows before a job ran.

It commits real manifests and real state chunks (per-user click counts held in key groups,
computed here in plain Python) through `snapshots_store`, including a rescale, a rollback that
keeps the abandoned commits under a tag, and a fork with provenance. The Spark engine writes
the same kind of history when it runs the example job.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass

import mmh3

from snapshots_store import Manifest, Repository

MAX_PARALLELISM = 128


@dataclass(frozen=True)
class DemoLineage:
    main_head: str
    fork_head: str
    commits: int


def key_group(user: str) -> int:
    return mmh3.hash(user.encode(), 0, signed=False) % MAX_PARALLELISM


def build_demo_lineage(repo: Repository, *, epochs: int = 8, users: int = 500) -> DemoLineage:
    """Commit `epochs` epochs on `main`, rescale 2 -> 3, roll back two epochs, fork `experiment`."""
    rng = random.Random(7)
    counts: Counter[str] = Counter()
    head: str | None = None
    commits = 0

    def commit_epoch(
        epoch: int,
        parallelism: int,
        kind: str,
        branch: str,
        parent: str | None,
        offset: int,
        provenance: dict[str, str] | None = None,
    ) -> str:
        nonlocal commits
        clicks = [f"user-{rng.randrange(users):04d}" for _ in range(200)]
        counts.update(clicks)
        changed = {key_group(u) for u in clicks}
        groups: dict[int, list[str]] = {}
        if parent is not None:
            groups = {g: list(ids) for g, ids in repo.read_manifest(parent).key_groups.items()}
        for group in sorted(changed):
            state = {u: c for u, c in counts.items() if key_group(u) == group}
            payload = json.dumps(state, sort_keys=True).encode()
            groups[group] = [repo.put_object("chunk", payload)]
        output = repo.put_object("output", json.dumps(sorted(set(clicks))).encode())
        manifest = Manifest(
            branch=branch,
            epoch=epoch,
            max_parallelism=MAX_PARALLELISM,
            parallelism=parallelism,
            kind=kind,
            parents=[parent] if parent else [],
            offsets={"clicks": {"0": offset}},
            key_groups=groups,
            outputs=[output],
            code_version="demo-1",
            config_hash="demo",
            stats={"records_in": len(clicks), "records_out": len(set(clicks))},
            provenance=provenance or {},
        )
        commits += 1
        return repo.commit(
            manifest,
            branch,
            expected_head=repo_head(repo, branch),
            reason=f"demo {kind} epoch {epoch}",
        )

    for epoch in range(1, epochs + 1):
        parallelism = 2 if epoch <= epochs // 2 else 3
        kind = "rescale" if epoch == epochs // 2 + 1 else "epoch"
        head = commit_epoch(epoch, parallelism, kind, "main", head, epoch * 200)
    assert head is not None
    rollback_to = repo.resolve(f"{head}~2")
    repo.cas_ref("tags/demo-abandoned", None, head, reason="rollback keeps the abandoned head")
    repo.cas_ref("heads/main", head, rollback_to, reason="demo rollback of two epochs")
    fork_from = repo.resolve(f"{rollback_to}~1")
    fork_head = commit_epoch(
        repo.read_manifest(fork_from).epoch + 1,
        2,
        "fork",
        "experiment",
        fork_from,
        (epochs - 2) * 200,
        provenance={"source_snapshot": fork_from, "requester": "demo", "reason": "try v2"},
    )
    return DemoLineage(main_head=rollback_to, fork_head=fork_head, commits=commits)


def repo_head(repo: Repository, branch: str) -> str | None:
    ref = repo.read_ref(f"heads/{branch}")
    return ref.target if ref else None
