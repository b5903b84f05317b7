"""The job web: jobs as nodes, branch-output edges (a job reading another's branch output),
their alignment state and lag; topology validation (the web must be a DAG).

Edges come from the store: the newest epoch on a job's branch records in ``extra.inputs``
which (namespace, branch) it read. An operation that is about to add an edge (``align``,
``hotswap``) validates the web with that edge added, so a cycle across jobs is refused
before it exists, with an error naming the cycle.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from controlplane.errors import InvalidRequest
from controlplane.jobs.models import Job
from controlplane.jobs.store import job_repository
from runners.engine.alignment import alignment_status
from runners.engine.branch_source import INPUTS, BranchOutputSource, upstream_epochs
from runners.engine.fan_in import fan_in_offsets, flatten_inputs
from snapshots_store import StoreError


def lag_alarm_epochs() -> int:
    """A downstream more than this many upstream epochs behind raises the lag alarm."""
    return int(settings.EPOCHAL_WEB_LAG_ALARM_EPOCHS)


@dataclass(frozen=True)
class Edge:
    upstream: str  # job names
    downstream: str
    source: str


def source_for(upstream: Job, *, name: str = "upstream") -> BranchOutputSource:
    """The branch-output source a downstream of `upstream` reads."""
    return BranchOutputSource(
        upstream.effective_store_url,
        upstream.application.store_namespace,
        upstream.branch,
        name=name,
    )


def _inputs(job: Job) -> dict[str, dict[str, Any]]:
    """``extra.inputs`` of the newest manifest on the job's branch that records any."""
    try:
        repo = job_repository(job)
        if repo.read_ref(f"heads/{job.branch}") is None:
            return {}
        for _, manifest in repo.log(f"heads/{job.branch}", first_parent=True, limit=50):
            inputs = manifest.extra.get(INPUTS)
            if isinstance(inputs, dict) and inputs:
                return {k: v for k, v in inputs.items() if isinstance(v, dict)}
    except StoreError:
        return {}
    return {}


@functools.lru_cache(maxsize=4096)
def _inputs_at(store_url: str, namespace: str, snapshot_id: str) -> tuple[tuple[str, Any], ...]:
    """``extra.inputs`` of the newest commit at or before `snapshot_id` (first parents, up to
    50) that records any. Cached: a committed snapshot never changes."""
    from snapshots_store import Repository

    repo = Repository.open(store_url, namespace)
    sid: str | None = snapshot_id
    for _ in range(50):
        if sid is None:
            break
        manifest = repo.read_manifest(sid)
        inputs = manifest.extra.get(INPUTS)
        if isinstance(inputs, dict) and inputs:
            return tuple(sorted((k, v) for k, v in inputs.items() if isinstance(v, dict)))
        sid = manifest.parents[0] if manifest.parents else None
    return ()


def head_inputs(store_url: str, namespace: str, snapshot_id: str) -> dict[str, dict[str, Any]]:
    """What a branch whose head is `snapshot_id` reads from other branches (source name ->
    ``extra.inputs`` document); {} when unreadable. One store read per new head."""
    try:
        return dict(_inputs_at(store_url, namespace, snapshot_id))
    except StoreError:
        return {}


def web_edges(jobs: Iterable[Job] | None = None) -> list[Edge]:
    """Branch-output edges between the control plane's jobs, as the store records them."""
    jobs = list(Job.objects.select_related("application") if jobs is None else jobs)
    by_location = {(j.application.store_namespace, j.branch): j for j in jobs}
    edges = []
    for job in jobs:
        for source, doc in flatten_inputs(_inputs(job)):
            if doc.get("kind") != "branch_output":
                continue
            upstream = by_location.get((str(doc.get("namespace")), str(doc.get("branch"))))
            if upstream is not None:
                edges.append(Edge(upstream.name, job.name, source))
    return edges


def find_cycle(edges: Iterable[tuple[str, str]]) -> list[str] | None:
    """A cycle in the directed graph as [a, b, …, a], or None when it is a DAG."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def validate_web(extra: Iterable[tuple[str, str]] = ()) -> None:
    """Refuse (InvalidRequest) a web that would not be a DAG once `extra` edges are added."""
    edges = [(e.upstream, e.downstream) for e in web_edges()] + list(extra)
    cycle = find_cycle(edges)
    if cycle is not None:
        path = " -> ".join(cycle)
        raise InvalidRequest(
            f"the job web must be acyclic (no cycles across jobs), but this would "
            f"close the cycle {path}; break it by reading from another branch",
            code="web_cycle",
            fields={"upstream_job": [f"closes the cycle {path}"]},
            detail={"cycle": cycle},
        )


def _fan_in_status(repo: Any, branch: str, upstream: Job, edge_source: str) -> dict[str, Any]:
    """An upstream edge of a fan-in: always merged at the marker; lag = upstream epochs
    committed and not read yet."""
    fan, name = edge_source.split("/", 1)
    head = repo.read_ref(f"heads/{branch}")
    manifest = None if head is None else repo.read_manifest(head.target)
    offsets = {} if manifest is None else manifest.offsets.get(fan, {})
    read = int(fan_in_offsets(offsets, name).get("epoch", 0))
    source = source_for(upstream, name=name)
    epochs = upstream_epochs(source.repo(), source.branch)
    latest = epochs[-1].epoch if epochs else 0
    inputs = {} if manifest is None else dict(flatten_inputs(manifest.extra.get(INPUTS) or {}))
    return {
        "state": "merged",
        "downstream_epoch": 0 if manifest is None else manifest.epoch,
        "consumed_epoch": read,
        "upstream_epoch": latest,
        "lag": sum(1 for e in epochs if e.epoch > read),
        "marker_ms": inputs.get(edge_source, {}).get("marker_ms"),
    }


def web_graph() -> dict[str, Any]:
    """Nodes (jobs) and edges with alignment state, lag and the lag alarm."""
    jobs = list(Job.objects.select_related("application").order_by("name"))
    by_name = {j.name: j for j in jobs}
    threshold = lag_alarm_epochs()
    nodes = []
    for job in jobs:
        head_epoch = None
        try:
            repo = job_repository(job)
            ref = repo.read_ref(f"heads/{job.branch}")
            if ref is not None:
                head_epoch = repo.read_manifest(ref.target).epoch
        except StoreError:
            pass
        nodes.append(
            {
                "job": job.name,
                "application": job.application.name,
                "branch": job.branch,
                "state": job.state,
                "epoch": head_epoch,
            }
        )
    edges = []
    for edge in web_edges(jobs):
        down = by_name[edge.downstream]
        repo = job_repository(down)
        try:
            if "/" in edge.source:  # one upstream of a fan-in (runners/engine/fan_in.py)
                info = _fan_in_status(repo, down.branch, by_name[edge.upstream], edge.source)
            else:
                source = source_for(by_name[edge.upstream], name=edge.source)
                control = repo.read_control(down.branch)[0]
                info = alignment_status(repo, down.branch, source, control).to_dict()
        except StoreError as exc:
            info = {"state": "unknown", "lag": None, "error": str(exc)}
        lag = info.get("lag")
        edges.append(
            {
                "upstream": edge.upstream,
                "downstream": edge.downstream,
                "source": edge.source,
                **info,
                "lag_alarm": isinstance(lag, int) and lag > threshold,
            }
        )
    return {"nodes": nodes, "edges": edges, "lag_alarm_epochs": threshold}


__all__ = [
    "Edge",
    "find_cycle",
    "head_inputs",
    "source_for",
    "validate_web",
    "web_edges",
    "web_graph",
]
