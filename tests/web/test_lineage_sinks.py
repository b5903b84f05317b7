"""The lineage view's sinks: per snapshot, whether each sink's destination holds its epoch,
derived from what the commits recorded (the sinks' pending records and the chain sinks' lag),
never by asking a destination. Commits are written with the store API as the engine writes
them (no Spark): a chain sink (Delta-like) that lags and catches up, a log sink, then a
rollback."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from controlplane.applications.services import application_create, version_create
from controlplane.jobs.services import job_create
from controlplane.lineage.models import Snapshot
from controlplane.lineage.services import reindex_application
from controlplane.lineage.sink_facts import sink_facts, sink_role
from controlplane.lineage.sink_status import sink_statuses, snapshot_sinks
from snapshots_store import Manifest, Repository

ClientFor = Callable[[str | None], Client]
LAKE = {"destination": "/data/lake", "writer": "epochal/ns/main/lake"}  # a chain sink's record
STREAM = {"stream": "totals", "identity": "ns/main", "epoch": 1, "generation": 0, "records": 3}


@dataclass
class Job:
    application: Any
    repo: Repository
    ids: dict[str, str] = field(default_factory=dict)  # label -> snapshot id
    head: str | None = None

    def commit(self, label: str, epoch: int, *, lag: int | None, kind: str = "epoch",
               sinks: bool = True, parent: str | None = None,
               stream_lag: int | None = None) -> str:  # fmt: skip
        """An engine-like commit on main: both sinks' pending records and the chain sink's lag
        (`lag`: epochs of the chain, up to the parent, the destination lacked; `stream_lag`:
        the log sink's own, recorded since the catch-up driver follows it too)."""
        extra: dict[str, Any] = {"job": "totals", "key": ["k"]}
        if sinks:
            extra["sinks"] = {
                name: {"epoch": epoch, "parts": [], "staged": staged}
                for name, staged in (("lake", LAKE), ("stream", {**STREAM, "epoch": epoch}))
            }
        parent = self.head if parent is None else parent
        manifest = Manifest(
            branch="main", epoch=epoch, parents=(parent,) if parent else (), max_parallelism=4,
            parallelism=1, kind=kind if parent else "initial",
            stats={"records_in": 10} if lag is None else {"records_in": 10, "sink_lag_epochs": lag},
            extra=extra,
        )  # fmt: skip
        if stream_lag is not None:
            manifest.stats["sink_lag_epochs.stream"] = stream_lag
        self.head = self.repo.commit(manifest, "main", expected_head=self.head, reason=label)
        self.ids[label] = self.head
        reindex_application(application=self.application, repo=self.repo)
        return self.head

    def statuses(self, branch: str | None = "main") -> dict[str, dict[str, str]]:
        found = sink_statuses(
            application=self.application, snapshot_ids=self.ids.values(), branch=branch
        )
        by_id = {sid: label for label, sid in self.ids.items()}
        return {by_id[sid]: s for sid, s in found.by_snapshot.items()}


@pytest.fixture
def job(store_url: str, users: dict[str, Any]) -> Job:
    application = application_create(name="totals", max_parallelism=4)
    version = version_create(application=application, job="clickstream", code_version="v1")
    job_create(name="totals-main", application=application, version=version)
    repo = Repository.open(application.effective_store_url, application.store_namespace)
    made = Job(application, repo)
    made.commit("e0", 0, lag=None, sinks=False)
    return made


def test_the_index_keeps_each_sinks_role_and_the_epoch_its_destination_held() -> None:
    from runners.engine.sink_catchup import ChainSinkBase
    from runners.engine.sinks import EpochOutput

    class Chain(ChainSinkBase):
        name = "lake"

        def destination(self) -> str:
            return "/data/lake"

    output = EpochOutput(None, "ns", "main", 5, (), ())  # type: ignore[arg-type]
    assert sink_role(Chain().prepare(output)) == "chain"  # the engine's own record
    assert sink_role({"topic": "t", "transactions": []}) == "log"  # Kafka
    assert sink_role(STREAM) == "log"  # Redis Streams, RabbitMQ Streams
    assert sink_role({"table": "a.t", "identity": "ns/main", "files": []}) == "two_phase"
    manifest = Manifest(
        branch="main", epoch=5, parents=(), max_parallelism=4, parallelism=1, kind="epoch",
        stats={"sink_lag_epochs": 2},
        extra={"sinks": {"lake": {"staged": LAKE}, "stream": {"staged": STREAM}}},
    )  # fmt: skip
    # epoch 5's parent is epoch 4; 2 epochs lacking: the destination held up to epoch 2
    assert sink_facts(manifest) == {
        "lake": {"role": "chain", "held": 2},
        "stream": {"role": "log", "held": None},
    }


def test_the_engine_records_each_chain_sinks_lag_and_the_index_uses_it() -> None:
    from runners.engine.sink_catchup import SinkFollower

    class Named:
        def __init__(self, name: str) -> None:
            self.name = name

    follower = SinkFollower(None, "ns", "main", [Named("lake"), Named("db")])  # type: ignore[arg-type, list-item]
    follower.states["lake"].lag_epochs = 3  # the lake is down; the database keeps up
    stats = follower.lag_stats()
    assert stats["sink_lag_epochs"] == 3
    assert stats["sink_lag_epochs.lake"] == 3 and stats["sink_lag_epochs.db"] == 0
    records = {name: {"staged": {**LAKE, "destination": name}} for name in ("lake", "db")}
    manifest = Manifest(
        branch="main", epoch=6, parents=(), max_parallelism=4, parallelism=1, kind="epoch",
        stats=stats, extra={"sinks": records},
    )  # fmt: skip
    assert sink_facts(manifest) == {
        "lake": {"role": "chain", "held": 2},
        "db": {"role": "chain", "held": 5},  # not held back by the lake's lag
    }


def test_a_lagging_sink_is_pending_until_a_later_commit_shows_it_caught_up(job: Job) -> None:
    job.commit("e1", 1, lag=0)
    job.commit("e2", 2, lag=1)  # the lake is down: it lacks epoch 1
    job.commit("e3", 3, lag=2)  # ... and 2
    assert job.statuses() == {
        "e1": {"lake": "pending", "stream": "written"},  # e2's run published e1 first
        "e2": {"lake": "pending", "stream": "written"},
        "e3": {"lake": "pending", "stream": "pending"},  # the head: nothing proves it yet
    }
    job.commit("e4", 4, lag=0)  # back: it caught up to epoch 3 before epoch 4 committed
    statuses = job.statuses()
    assert {label: s["lake"] for label, s in statuses.items()} == {
        "e1": "written",
        "e2": "written",
        "e3": "written",
        "e4": "pending",
    }
    assert "e0" not in statuses  # epoch 0 holds no output: no sink has a part in it
    # a restart that never reached the lake records it lacking the whole chain: the newest
    # record decides, and says nothing is known to be there (the table may be a new one)
    job.commit("e5", 5, lag=4)
    assert {s["lake"] for s in job.statuses().values()} == {"pending"}
    job.commit("e6", 6, lag=0)  # reached again: it holds the chain up to epoch 5
    assert [label for label, s in job.statuses().items() if s["lake"] == "pending"] == ["e6"]


def test_after_a_rollback_the_left_line_is_abandoned_and_the_new_line_follows(
    job: Job, client_for: ClientFor
) -> None:
    for epoch in (1, 2, 3, 4):
        job.commit(f"e{epoch}", epoch, lag=0)
    # roll back to epoch 2 (an operation's commit: no sink records, the target's epoch)
    job.commit("rollback", 2, lag=None, kind="rollback", sinks=False, parent=job.ids["e2"])
    job.commit("e3b", 3, lag=0)  # the restarted run rewound the lake to epoch 2 first
    statuses = job.statuses(branch=None)  # each snapshot against its own branch's head
    assert statuses["e3"] == {"lake": "abandoned", "stream": "abandoned_published"}
    assert statuses["e4"] == {"lake": "abandoned", "stream": "abandoned"}  # never published
    assert statuses["e2"] == {"lake": "written", "stream": "written"}
    assert statuses["rollback"] == {"lake": "written"}  # epoch 2, held; it staged no log
    assert statuses["e3b"] == {"lake": "pending", "stream": "pending"}

    viewer = client_for("viewer")
    # the REST snapshot: a `sinks` field, within the API's query budget
    api = viewer.get(f"/api/applications/totals/snapshots/{job.ids['e3']}/").json()
    assert api["sinks"] == {"lake": "abandoned", "stream": "abandoned_published"}
    assert viewer.get(f"/api/applications/totals/snapshots/{job.ids['e0']}/").json()["sinks"] == {}

    # the lineage page: badges with words (not colour alone) on every row
    html = viewer.get("/applications/totals/lineage/").content.decode()
    assert 'data-testid="sink-legend"' in html

    def row(label: str) -> str:
        return html[html.index(f'data-snapshot="{job.ids[label]}" data-kind') :].split("</li>")[0]

    e3_row = row("e3")
    assert 'data-sink="lake" data-status="abandoned"' in e3_row
    assert "stream: abandoned, published</span>" in e3_row
    e2_row = row("e2")
    assert "lake: written</span>" in e2_row and "stream: written</span>" in e2_row
    # the snapshot panel says it too
    panel = viewer.get(
        f"/applications/totals/snapshots/{job.ids['e3b']}/", HTTP_HX_REQUEST="true"
    ).content.decode()
    assert 'data-testid="snapshot-sinks"' in panel
    assert '<tr data-sink="lake" data-status="pending">' in panel


def test_the_page_reads_the_sinks_in_a_fixed_number_of_statements(
    job: Job, client_for: ClientFor
) -> None:
    viewer = client_for("viewer")

    def statements(url: str) -> int:
        cache.clear()  # the page caches its count of commits by kind
        with CaptureQueriesContext(connection) as captured:
            assert viewer.get(url).status_code == 200
        return len(captured)

    for epoch in (1, 2):
        job.commit(f"e{epoch}", epoch, lag=0)
    few = {u: statements(u) for u in ("/applications/totals/lineage/?branch=main",
                                      "/applications/totals/lineage/")}  # fmt: skip
    for epoch in range(3, 13):
        job.commit(f"e{epoch}", epoch, lag=1)
    many = {u: statements(u) for u in few}
    assert many == few  # no statement per row
    assert Snapshot.objects.filter(application=job.application).count() == 13
    head = Snapshot.objects.get(snapshot_id=job.head)
    assert snapshot_sinks(application=job.application, snapshot=head) == {
        "lake": "pending",
        "stream": "pending",
    }


def test_reindex_fills_the_sink_facts_of_snapshots_indexed_before_them(
    job: Job, store_url: str
) -> None:
    from io import StringIO

    from django.core.management import call_command

    for epoch in (1, 2):
        job.commit(f"e{epoch}", epoch, lag=0)
    before = job.statuses()
    Snapshot.objects.filter(application=job.application).update(sinks={})  # an older index
    assert job.statuses() == {}
    out = StringIO()
    call_command("reindex", application="totals", store=store_url, sink_facts=True, stdout=out)
    assert "totals: sink facts of 2 snapshots filled" in out.getvalue()
    assert (
        job.statuses()
        == before
        == {
            "e1": {"lake": "written", "stream": "written"},
            "e2": {"lake": "pending", "stream": "pending"},
        }
    )


def test_a_followed_log_sink_is_judged_by_its_own_lag_not_by_a_child(job: Job) -> None:
    """Redis and RabbitMQ Streams (and Iceberg) follow the branch on the catch-up driver: a
    child committed while the log was down does not prove the log has the epoch."""
    job.commit("e1", 1, lag=0, stream_lag=0)
    job.commit("e2", 2, lag=0, stream_lag=1)  # the log is down: it lacks epoch 1
    job.commit("e3", 3, lag=0, stream_lag=2)
    assert {label: s["stream"] for label, s in job.statuses().items()} == {
        "e1": "pending",  # a child staged it, but the log lacked it when e2 committed
        "e2": "pending",
        "e3": "pending",
    }
    job.commit("e4", 4, lag=0, stream_lag=0)  # back: it caught up to epoch 3 in order
    assert [label for label, s in job.statuses().items() if s["stream"] == "pending"] == ["e4"]


def test_a_rollback_while_the_log_lags_leaves_its_unpublished_epoch_abandoned(
    job: Job,
) -> None:
    for epoch, stream_lag in ((1, 0), (2, 0), (3, 1)):  # the log lacks epoch 2 when 3 commits
        job.commit(f"e{epoch}", epoch, lag=0, stream_lag=stream_lag)
    job.commit("rollback", 2, lag=None, kind="rollback", sinks=False, parent=job.ids["e2"])
    job.commit("e3b", 3, lag=0, stream_lag=0)  # back: it holds the chain up to epoch 2
    statuses = job.statuses(branch=None)
    assert statuses["e3"]["stream"] == "abandoned"  # never staged by a child: never published
    assert statuses["e2"]["stream"] == "written" and statuses["e1"]["stream"] == "written"
    assert statuses["e3b"]["stream"] == "pending"


def test_the_snapshot_log_and_graph_carry_the_sinks_on_request(
    job: Job, client_for: ClientFor, settings: Any
) -> None:
    settings.EPOCHAL_RESPONSE_CACHE_BYTES = 0  # every read is built
    viewer = client_for("viewer")
    for epoch in (1, 2):
        job.commit(f"e{epoch}", epoch, lag=0, stream_lag=0)
    one = {
        label: viewer.get(f"/api/applications/totals/snapshots/{sid}/").json()["sinks"]
        for label, sid in job.ids.items()
    }
    expected = {job.ids[label]: sinks for label, sinks in one.items() if sinks}
    assert expected[job.ids["e1"]] == {"lake": "written", "stream": "written"}
    urls = ("/api/applications/totals/snapshots/?rev=main", "/api/applications/totals/lineage/")
    for url in urls:
        plain = viewer.get(url).json()
        assert "sinks" not in plain  # the three-statement reads stay as they were
        prerendered = viewer.get(url + ("&" if "?" in url else "?") + "sinks=true")
        rendered = viewer.get(
            url + ("&" if "?" in url else "?") + "sinks=true",
            HTTP_ACCEPT="application/json; indent=2",
        )
        assert prerendered.json()["sinks"] == rendered.json()["sinks"] == expected, url
        assert list(prerendered.json()["sinks"]) == [
            r["snapshot_id"] for r in prerendered.json()["results"] if r["snapshot_id"] in expected
        ]  # in the page's order

    def statements(url: str) -> int:
        viewer.get(url)  # the session and the application's id cached, as in use
        with CaptureQueriesContext(connection) as captured:
            assert viewer.get(url).status_code == 200
        return len(captured)

    few = {u: statements(u + ("&" if "?" in u else "?") + "sinks=true") for u in urls}
    for epoch in range(3, 13):
        job.commit(f"e{epoch}", epoch, lag=1, stream_lag=1)
    assert {u: statements(u + ("&" if "?" in u else "?") + "sinks=true") for u in urls} == few
