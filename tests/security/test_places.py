"""Finding 2: an operator must not reach a place of their choosing. Migrate copy takes no URL,
only a store an admin registered; `file://` stores live under EPOCHAL_STORE_ROOTS; branch names
are checked before anything reaches a store. Through a live server with a real Celery worker;
each attack is a 4xx naming the field, audited, reaches no listener, writes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controlplane.applications.models import Application, Store
from controlplane.operations.models import Operation
from tests.api.conftest import Lineage
from tests.security.attacks import Listener, Worker, call, refusals, store_files
from tests.security.servers import manage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services]

MIGRATE = "/api/jobs/clicks-main/operations/"


def _root(store_url: str) -> Path:
    return Path(store_url.removeprefix("file://"))


def test_migrate_copy_takes_no_url(
    live_server: Any,
    lineage: Lineage,
    store_url: str,
    tokens: dict[str, str],
    worker: Worker,
    listener: Listener,
    tmp_path: Path,
) -> None:
    attacker_dir = tmp_path / "attacker"
    before = store_files(_root(store_url))
    for url in (
        "file:///etc",
        "file:///root",
        f"file://{attacker_dir}",
        f"s3://loot/lineage?endpoint_url={listener.url}",
    ):
        body = {"kind": "migrate", "params": {"mode": "copy", "store_url": url}}
        response = call(live_server.url, tokens["operator"], "POST", MIGRATE, body)
        assert response.status_code == 400, response.text
        assert "store_url" in response.json()["error"]["fields"]
    assert len(refusals(MIGRATE, 400, "store_url")) == 4
    # A store name that no admin registered is refused too, naming `store` (well-formed, but
    # it names nothing registered: 422).
    body = {"kind": "migrate", "params": {"mode": "copy", "store": "etc"}}
    response = call(live_server.url, tokens["operator"], "POST", MIGRATE, body)
    assert response.status_code == 422 and "store" in response.json()["error"]["fields"]
    assert refusals(MIGRATE, 422, "store")
    assert Operation.objects.filter(kind="migrate").count() == 0
    assert listener.connections == [], "no request reached the attacker's listener"
    assert not attacker_dir.exists()
    assert store_files(_root(store_url)) == before
    assert Application.objects.get(name="clicks").store is None


def test_migrate_copy_to_a_registered_store_works(
    live_server: Any, lineage: Lineage, store_url: str, tokens: dict[str, str], worker: Worker,
    tmp_path: Path, settings: Any,
) -> None:  # fmt: skip
    """The legitimate path the attacks are refused in favour of: an admin registers, an
    operator names it, the worker copies the lineage there."""
    settings.EPOCHAL_STORE_ROOTS = (tmp_path,)
    target = tmp_path / "archive"
    registered = manage_register("archive", f"file://{target}", tmp_path)
    assert registered.returncode == 0, registered.stderr
    body = {"kind": "migrate", "params": {"mode": "copy", "store": "archive"}}
    response = call(live_server.url, tokens["operator"], "POST", MIGRATE, body)
    assert response.status_code == 202, response.text
    op = worker.wait_for(response.json()["id"])
    assert op.state == "succeeded", op.error_message
    assert Application.objects.get(name="clicks").store.name == "archive"  # type: ignore[union-attr]
    assert store_files(target)


def manage_register(name: str, url: str, root: Path) -> Any:
    import os

    from tests.security.attacks import database_url

    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "EPOCHAL_STORE_ROOTS": str(root),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
    }
    return manage(env, "register_store", name, url)


@pytest.mark.parametrize(
    "url",
    ["file:///etc", "file:///root/.ssh", "FILE_UNDER_ROOT/../../escape", "ftp://host/x", "s3://"],
)
def test_stores_outside_the_roots_cannot_be_registered(
    postgresql_db: None, tmp_path: Path, url: str
) -> None:
    root = tmp_path / "stores"
    root.mkdir()
    url = url.replace("FILE_UNDER_ROOT", f"file://{root}")
    done = manage_register("evil", url, root)
    assert done.returncode != 0
    assert "url" in done.stderr
    assert not Store.objects.filter(name="evil").exists()


def test_a_symlink_out_of_the_roots_is_refused(postgresql_db: None, tmp_path: Path) -> None:
    root = tmp_path / "stores"
    root.mkdir()
    (root / "link").symlink_to("/etc")
    done = manage_register("evil", f"file://{root / 'link'}", root)
    assert done.returncode != 0 and "outside the store roots" in done.stderr
    assert not Store.objects.exists()


def test_operators_cannot_register_stores(
    live_server: Any, lineage: Lineage, tokens: dict[str, str]
) -> None:
    body = {"name": "evil", "url": "file:///etc"}
    response = call(live_server.url, tokens["operator"], "POST", "/api/stores/", body)
    assert response.status_code == 403
    assert not Store.objects.exists()


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/api/applications/clicks/mapping/?branch=../../etc", "branch"),
        ("/api/applications/clicks/mapping/?branch=main/../../../etc", "branch"),
        ("/api/applications/clicks/mapping/?branch=x.lock", "branch"),
        ("/api/applications/clicks/state/?branch=..%2F..%2Fetc&key=a", "branch"),
        (
            "/api/applications/clicks/state/?as_of_application=clicks&as_of_epoch=1"
            "&as_of_branch=../x&key=a",
            "as_of_branch",
        ),
    ],
)
def test_branch_names_are_refused_before_the_store(
    live_server: Any,
    lineage: Lineage,
    store_url: str,
    tokens: dict[str, str],
    path: str,
    field: str,
) -> None:
    before = store_files(_root(store_url))
    response = call(live_server.url, tokens["viewer"], "GET", path)
    assert response.status_code == 400, response.text
    assert field in response.json()["error"]["fields"]
    assert refusals(path.split("?")[0], 400, field), "the probe is audited"
    assert store_files(_root(store_url)) == before


@pytest.mark.parametrize("branch", ["../../etc", "a..b", "x.lock", "-x", "x.", "a//b", "a b"])
def test_fork_branch_names_follow_check_ref_format(
    live_server: Any,
    lineage: Lineage,
    store_url: str,
    tokens: dict[str, str],
    worker: Worker,
    branch: str,
) -> None:
    before = store_files(_root(store_url))
    body = {"kind": "fork", "params": {"snapshot": lineage.main[1], "branch": branch}}
    path = "/api/applications/clicks/operations/"
    response = call(live_server.url, tokens["operator"], "POST", path, body)
    assert response.status_code == 400, response.text
    assert "branch" in response.json()["error"]["fields"]
    assert refusals(path, 400, "branch")
    assert Operation.objects.count() == 0
    assert store_files(_root(store_url)) == before
