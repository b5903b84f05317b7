"""Login lockouts behind an Ingress: `X-Forwarded-For` is believed only from the proxies in
`EPOCHAL_TRUSTED_PROXIES`, and then its rightmost address that is not a trusted proxy is the
client's (what a client writes itself lands to the left). Both ways through the deployed
server: behind a trusted proxy each client has its own lockout; from anywhere else the header
is ignored, so nobody picks the address their failures count against."""

from __future__ import annotations

import re

import requests

from tests.security.deployed import Deployment

LIMIT = 3


def _attempt(base: str, password: str, forwarded_for: str) -> int:
    with requests.Session() as browser:
        browser.headers["X-Forwarded-For"] = forwarded_for
        page = browser.get(f"{base}/login/", timeout=60)
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert csrf is not None
        return browser.post(
            f"{base}/login/",
            data={"username": "viewer", "password": password, "csrfmiddlewaretoken": csrf[1]},
            headers={"Referer": f"{base}/login/"},
            allow_redirects=False,
            timeout=60,
        ).status_code


def _lock_out(base: str, forwarded_for: str) -> None:
    for _ in range(LIMIT - 1):
        assert _attempt(base, "wrong password", forwarded_for) == 200  # the form again
    assert _attempt(base, "wrong password", forwarded_for) == 429  # the one that locks


def test_behind_a_trusted_proxy_each_client_has_its_own_lockout(deployment: Deployment) -> None:
    right = deployment.password("viewer")
    with deployment.serve(
        EPOCHAL_TRUSTED_PROXIES="127.0.0.1,10.0.0.0/8", EPOCHAL_LOGIN_FAILURE_LIMIT=str(LIMIT)
    ) as base:
        # the client wrote 198.51.100.1 itself; the proxies (10.0.0.7, then this test's
        # 127.0.0.1) appended what they saw
        _lock_out(base, "198.51.100.1, 203.0.113.5, 10.0.0.7")
        assert _attempt(base, right, "203.0.113.5, 10.0.0.7") == 429  # locked, right password too
        assert _attempt(base, right, "198.51.100.1, 203.0.113.6, 10.0.0.7") == 302
    rows = deployment.audit("a.action = 'login' AND a.outcome = 'ok'")
    assert rows[-1]["detail"]["address"] == "203.0.113.6"


def test_from_an_untrusted_peer_the_header_is_ignored(deployment: Deployment) -> None:
    right = deployment.password("viewer")
    for trusted in ("", "10.0.0.0/8"):  # no proxies; proxies, but not this peer
        with deployment.serve(
            EPOCHAL_TRUSTED_PROXIES=trusted, EPOCHAL_LOGIN_FAILURE_LIMIT=str(LIMIT)
        ) as base:
            _lock_out(base, "203.0.113.5")
            # another "client" by the header is the same peer: locked out as well
            assert _attempt(base, right, "203.0.113.6") == 429
