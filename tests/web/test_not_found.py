"""404s are ours: a person gets the dashboard's page naming the path, a program the API's
error shape — never Django's debug page listing every URL pattern (the demo runs without
DEBUG, as production does)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.test import Client

ClientFor = Callable[[str | None], Client]


@pytest.fixture(autouse=True)
def no_debug(settings: object) -> None:
    settings.DEBUG = False  # type: ignore[attr-defined]


def test_an_unknown_page_gets_our_404(client_for: ClientFor) -> None:
    page = client_for("viewer").get("/no/such/page/")
    assert page.status_code == 404
    html = page.content.decode()
    assert "There is no page at /no/such/page/" in html
    assert 'href="/audit/"' in html  # the layout and its navigation
    assert "URLconf" not in html and "urlpatterns" not in html


def test_an_unknown_api_path_gets_the_api_error_shape(client_for: ClientFor) -> None:
    answer = client_for("viewer").get("/api/no-such-thing/")
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "no_endpoint"
