"""API rate limits through two deployed web servers (replicas) sharing Redis (`CACHE_URL`):
`EPOCHAL_API_RATE` per token and `EPOCHAL_API_ADDRESS_RATE` per client address (behind the
trusted proxy), counted together by both replicas; the request over a limit gets 429
`throttled` with `Retry-After`, and what another token or address sends is not held back."""

from __future__ import annotations

import time
from urllib.parse import urlsplit, urlunsplit

import requests

from tests.security.deployed import Deployment, api

PER_TOKEN = 6
PER_ADDRESS = 10


def _get(base: str, token: str | None, address: str) -> requests.Response:
    return api(base, token, "GET", "/api/jobs/", headers={"X-Forwarded-For": address})


def _throttled(answer: requests.Response) -> None:
    assert answer.status_code == 429, answer.text
    assert int(answer.headers["Retry-After"]) >= 1
    error = answer.json()["error"]
    assert error["code"] == "throttled" and error["detail"]["retry_after_s"] >= 1


def test_rate_limits_per_token_and_per_address_across_replicas(
    deployment: Deployment, redis_url: str
) -> None:
    if time.time() % 3600 > 3540:  # hourly windows: not across the hour's end
        time.sleep(3600 - time.time() % 3600 + 1)
    cache = urlunsplit(urlsplit(redis_url)._replace(path="/11"))
    settings = {
        "CACHE_URL": cache,
        "EPOCHAL_API_RATE": f"{PER_TOKEN}/hour",
        "EPOCHAL_API_ADDRESS_RATE": f"{PER_ADDRESS}/hour",
        "EPOCHAL_TRUSTED_PROXIES": "127.0.0.1",
    }
    # addresses of this run only (the shared cache outlives it)
    run = int(time.time() * 1000) % 250
    address = [f"198.18.{run}.{n}" for n in range(1, 6)]
    viewer, operator, admin = (deployment.tokens[r] for r in ("viewer", "operator", "admin"))
    with deployment.serve(**settings) as a, deployment.serve(**settings) as b:
        replicas = [a, b]
        # per token: the viewer's requests on either replica count together
        for n in range(PER_TOKEN):
            assert _get(replicas[n % 2], viewer, address[0]).status_code == 200
        _throttled(_get(a, viewer, address[0]))
        _throttled(_get(b, viewer, address[1]))  # the token, from anywhere
        assert _get(a, operator, address[0]).status_code == 200  # another token
        # per address: two tokens, each under its own limit, from one address
        for n in range(PER_ADDRESS):
            token = operator if n % 2 else admin
            assert _get(replicas[n % 2], token, address[2]).status_code == 200
        _throttled(_get(a, admin, address[2]))
        assert _get(b, admin, address[3]).status_code == 200  # the same token elsewhere
        # requests without a token count against their address too (and are refused after)
        for n in range(PER_ADDRESS):
            assert _get(replicas[n % 2], None, address[4]).status_code == 401
        _throttled(_get(b, None, address[4]))
