"""Sign-ins through the real HTTP stack: audited (success, and failure of an existing user),
locked out after the failure limit on the shared cache (Redis when configured), and anonymous
rejections counted (cache counters and a metric) instead of one audit row each. Passwords are
validated wherever users are created."""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from django.core.management import CommandError, call_command

from controlplane.accounts.services import user_create
from controlplane.audit.models import AuditEntry
from controlplane.audit.rejections import (
    LOGIN_LOCKED_OUT,
    LOGIN_UNKNOWN_USER,
    UNAUTHENTICATED,
    rejection_totals,
)
from tests.api.conftest import Lineage
from tests.e2e.harness import database_url
from tests.security.servers import clean_env, new_secret_key, web_server

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "correct horse battery staple"


def sign_in(base: str, username: str, password: str) -> requests.Response:
    with requests.Session() as browser:
        page = browser.get(f"{base}/login/", timeout=60)
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert csrf is not None
        return browser.post(
            f"{base}/login/",
            data={
                "username": username,
                "password": password,
                "csrfmiddlewaretoken": csrf.group(1),
            },
            headers={"Referer": f"{base}/login/"},
            allow_redirects=False,
            timeout=60,
        )


def logins() -> list[tuple[str, str]]:
    return [
        (e.outcome, e.actor_name or e.detail.get("user", ""))
        for e in AuditEntry.objects.filter(action="login").order_by("id")
    ]


def test_sign_ins_are_audited_and_locked_out_after_the_limit(
    live_server: Any, settings: Any
) -> None:
    user_create(username="ana", role="viewer", password=PASSWORD)
    base = live_server.url
    ok = sign_in(base, "ana", PASSWORD)
    assert ok.status_code == 302
    assert logins() == [("ok", "ana")]

    limit = settings.AXES_FAILURE_LIMIT
    for attempt in range(1, limit + 1):
        failed = sign_in(base, "ana", f"guess {attempt}")
        assert failed.status_code == (429 if attempt == limit else 200), attempt
    assert logins() == [("ok", "ana")] + [("failed", "ana")] * (limit - 1) + [("locked-out", "ana")]
    locked_before = rejection_totals()[LOGIN_LOCKED_OUT]
    # Locked: even the right password is refused, counted, and not a row each.
    for _ in range(3):
        refused = sign_in(base, "ana", PASSWORD)
        assert refused.status_code == 429
        assert "Too many failed sign-ins" in refused.text
    assert len(logins()) == limit + 1
    assert rejection_totals()[LOGIN_LOCKED_OUT] == locked_before + 3


def test_sign_ins_naming_nobody_and_anonymous_requests_are_counted_not_audited(
    live_server: Any, lineage: Lineage
) -> None:
    base = live_server.url
    before = rejection_totals()
    rows = AuditEntry.objects.count()
    for n in range(7):
        assert sign_in(base, f"nobody-{n}", "whatever it is").status_code == 200
    for _ in range(20):
        anonymous = requests.post(f"{base}/api/jobs/", json={}, timeout=60)
        assert anonymous.status_code == 401
        guessed = requests.get(
            f"{base}/api/jobs/", headers={"Authorization": "Token epo_guess"}, timeout=60
        )
        assert guessed.status_code == 401
    assert AuditEntry.objects.count() == rows
    after = rejection_totals()
    assert after[LOGIN_UNKNOWN_USER] == before[LOGIN_UNKNOWN_USER] + 7
    assert after[UNAUTHENTICATED] == before[UNAUTHENTICATED] + 40
    admin = user_create(username="boss", role="admin")
    from controlplane.accounts.tokens import token_create

    secret = token_create(user=admin).secret
    metrics = requests.get(
        f"{base}/metrics", headers={"Authorization": f"Token {secret}"}, timeout=60
    ).text
    assert f'epochal_rejections_total{{kind="unauthenticated"}} {after[UNAUTHENTICATED]}' in (
        metrics
    )


def test_a_lockout_holds_across_servers_sharing_redis(
    live_server: Any, postgresql_db: None, redis_url: str, tmp_path: Path, settings: Any
) -> None:
    """Two web servers (two replicas, two workers each) on one database and one Redis
    (CACHE_URL): failures on one lock the user out on the other."""
    user_create(username="bea", role="viewer", password=PASSWORD)
    env = clean_env(
        tmp_path,
        DJANGO_SECRET_KEY=new_secret_key(),
        DATABASE_URL=database_url(),
        CACHE_URL=redis_url,
    )
    shared = redis.Redis.from_url(redis_url)

    def forget() -> None:
        for key in shared.scan_iter("epochal:*"):
            shared.delete(key)

    forget()
    try:
        with web_server(env, workers=2) as first, web_server(env, workers=2) as second:
            for attempt in range(settings.AXES_FAILURE_LIMIT):
                server = first if attempt % 2 else second
                sign_in(server, "bea", f"guess {attempt}")
            assert any(b"axes" in key for key in shared.scan_iter("epochal:*"))
            assert sign_in(first, "bea", PASSWORD).status_code == 429
            assert sign_in(second, "bea", PASSWORD).status_code == 429
        assert [o for o, _ in logins()] == ["failed"] * (settings.AXES_FAILURE_LIMIT - 1) + [
            "locked-out"
        ]
    finally:
        forget()


def test_passwords_are_validated_wherever_users_are_created(
    live_server: Any, tokens: dict[str, str]
) -> None:
    with pytest.raises(CommandError, match=r"too common|too short|entirely numeric"):
        call_command(
            "createuser", "weak", "--role", "viewer", "--password", "12345678", stdout=StringIO()
        )
    api = requests.post(
        f"{live_server.url}/api/users/",
        json={"username": "weak", "role": "viewer", "password": "password"},
        headers={"Authorization": f"Token {tokens['admin']}"},
        timeout=60,
    )
    assert api.status_code == 422 and "password" in api.json()["error"]["fields"]
    assert api.json()["error"]["code"] == "weak_password"
    from django.contrib.auth import get_user_model
    from django.test import Client

    root = user_create(username="root", role="admin", password=PASSWORD)
    root.is_staff = root.is_superuser = True
    root.save()
    browser = Client()
    browser.force_login(root)
    form = browser.post(
        "/admin/auth/user/add/",
        {
            "username": "weak",
            "password1": "qwerty12",
            "password2": "qwerty12",
            "usable_password": "true",
        },
    )
    assert form.status_code == 200 and "too common" in form.content.decode()
    assert not get_user_model().objects.filter(username="weak").exists()
