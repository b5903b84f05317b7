"""Credentials never travel inside a store URL: registering one with userinfo (in the URL or
its endpoint_url) is refused with a message pointing at credentials_env / credentials_secret
(the command line, and the admin site: both run the model's check), and a row that has one
from before the rule is shown to viewers, and written to the audit, without it."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security.deployed import Deployment, api
from tests.security.servers import PROJECT_ROOT, manage

SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYzz"
URLS = (
    f"s3://AKIAEXAMPLE:{SECRET}@bucket/p",
    f"s3://bucket/p?endpoint_url=http://u:{SECRET}@minio:9000",
)


@pytest.fixture(scope="module")
def base(deployment: Deployment) -> Iterator[str]:
    with deployment.serve() as url:
        yield url


def test_a_store_url_with_credentials_cannot_be_registered(
    deployment: Deployment, base: str
) -> None:
    for url in URLS:
        done = manage(deployment.env(), "register_store", "leaky", url)
        assert done.returncode != 0
        said = done.stdout + done.stderr
        assert "credentials_env" in said and "credentials_secret" in said, said
        assert SECRET not in said
    stores = api(base, deployment.tokens["viewer"], "GET", "/api/stores/").json()["results"]
    assert "leaky" not in [s["name"] for s in stores]


def test_a_url_registered_before_the_rule_is_never_shown_with_its_credentials(
    deployment: Deployment, base: str
) -> None:
    with sqlite3.connect(deployment.database, timeout=30) as db:
        for n, url in enumerate(URLS):
            db.execute(
                "INSERT INTO applications_store (name, url, credentials_env, credentials_secret,"
                " description, created_at) VALUES (?, ?, '', '', '', datetime('now'))",
                (f"old-{n}", url),
            )
    answer = api(base, deployment.tokens["viewer"], "GET", "/api/stores/")
    assert answer.status_code == 200
    assert SECRET not in answer.text and "AKIAEXAMPLE" not in answer.text
    shown = {s["name"]: s["url"] for s in answer.json()["results"]}
    assert shown["old-0"] == "s3://***@bucket/p"
    assert shown["old-1"] == "s3://bucket/p?endpoint_url=http://***@minio:9000"
    listed = subprocess.run(
        [str(Path(sys.executable).parent / "epochal"), "stores"],
        cwd=PROJECT_ROOT,
        env=deployment.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert "old-0" in listed.stdout and SECRET not in listed.stdout + listed.stderr
    assert not deployment.audit("a.detail LIKE ?", f"%{SECRET}%")
