"""A deployment as the Helm chart runs it, for tests that attack it over HTTP: the web server
(granian, `tests.security.servers.web_command`) on a database of its own, migrated once per
test run, with a user and an API token of each role (and a password for the dashboard), the
example application `clicks` (M=8) with a small indexed lineage and its job `clicks-main`.

Every server of the run serves the same database file with the environment a test gives it
(production settings: no debug, a generated secret key); a test reads what the server wrote
(the audit log) from that file with plain SQL.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.security.servers import PROJECT_ROOT, clean_env, manage, new_secret_key, web_server

ROLES = ("viewer", "operator", "admin")
APPLICATION = "clicks"
JOB = "clicks-main"

_SETUP = """
import json
import re
from controlplane.accounts.services import user_create, user_token
from tests.api.conftest import build_lineage

tokens = {
    role: user_token(user=user_create(username=role, role=role, password=f"pw-{role}-Xq7!long"))
    for role in ("viewer", "operator", "admin")
}
lineage = build_lineage("clicks")
print(json.dumps({"tokens": tokens, "main": lineage.main}))
"""


@dataclass
class Deployment:
    var_dir: Path
    secret_key: str
    tokens: dict[str, str]
    main: list[str]  # snapshot ids on main, oldest first

    @property
    def database(self) -> Path:
        return self.var_dir / "db.sqlite3"

    def env(self, **overrides: str) -> dict[str, str]:
        return clean_env(
            self.var_dir,
            DJANGO_SECRET_KEY=self.secret_key,
            STORE_URL=f"file://{self.var_dir / 'store'}",
            LOG_LEVEL="WARNING",
            **overrides,
        )

    @contextmanager
    def serve(self, *, workers: int = 1, threads: int = 8, **env: str) -> Iterator[str]:
        """The chart's web command on this deployment's database; yields its base URL."""
        with web_server(self.env(**env), workers=workers, threads=threads) as url:
            yield url

    def password(self, role: str) -> str:
        return f"pw-{role}-Xq7!long"

    def audit(self, where: str = "1=1", *args: Any) -> list[dict[str, Any]]:
        """Audit rows (newest last) matching the SQL condition `where`."""
        with sqlite3.connect(self.database, timeout=30) as db:
            db.row_factory = sqlite3.Row
            rows = db.execute(
                "SELECT a.*, u.username FROM audit_auditentry a "
                "LEFT JOIN auth_user u ON u.id = a.actor_id "
                f"WHERE {where} ORDER BY a.id",
                args,
            ).fetchall()
        found = [dict(r) for r in rows]
        for row in found:
            row["detail"] = json.loads(row["detail"] or "{}")
        return found


def api(base: str, token: str | None, method: str, path: str, **kwargs: Any) -> requests.Response:
    headers = {"Connection": "close", **kwargs.pop("headers", {})}
    if token:
        headers["Authorization"] = f"Token {token}"
    return requests.request(method, f"{base}{path}", headers=headers, timeout=60, **kwargs)


def prepare(var_dir: Path) -> Deployment:
    """Migrate a new database under `var_dir` and fill it (see the module's docstring)."""
    var_dir.mkdir(parents=True, exist_ok=True)
    deployment = Deployment(var_dir, new_secret_key(), {}, [])
    env = deployment.env()
    migrated = manage(env, "migrate", "--no-input")
    assert migrated.returncode == 0, migrated.stderr
    filled = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", _SETUP],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert filled.returncode == 0, filled.stderr
    facts = json.loads(filled.stdout.strip().splitlines()[-1])
    deployment.tokens, deployment.main = facts["tokens"], facts["main"]
    return deployment


@pytest.fixture(scope="session")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Deployment:
    return prepare(tmp_path_factory.mktemp("deployment") / "var")


def signed_in(base: str, username: str, password: str) -> requests.Session:
    """A browser session signed in to the dashboard (its CSRF token in `headers`)."""
    browser = requests.Session()
    page = browser.get(f"{base}/login/", timeout=60)
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert csrf is not None, page.text[:500]
    answer = browser.post(
        f"{base}/login/",
        data={"username": username, "password": password, "csrfmiddlewaretoken": csrf.group(1)},
        headers={"Referer": f"{base}/login/"},
        allow_redirects=False,
        timeout=60,
    )
    assert answer.status_code == 302, answer.text[:500]
    browser.headers["X-CSRFToken"] = browser.cookies["csrftoken"]
    browser.headers["Referer"] = f"{base}/"
    return browser
