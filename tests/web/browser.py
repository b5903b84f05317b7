"""Driving Debian's Chromium with Playwright against the live server.

Every page is watched: console errors and uncaught exceptions are collected, and every request
to a host other than the live server's is aborted and recorded, so a test can assert that the
dashboard works without any of them. Screenshots go to var/artifacts/screenshots.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from tests.conftest import require_service

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "var" / "artifacts" / "screenshots"
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]"}
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
#: the page is complete and htmx, if the page loads it, has run
PAGE_READY = (
    "document.readyState === 'complete' && "
    "(typeof window.htmx !== 'undefined' || !document.querySelector('script[src*=htmx]'))"
)


@dataclass
class Watched:
    """A browser context logged in (or not) to the live server, with what it saw go wrong."""

    context: Any
    page: Any
    base_url: str
    console_errors: list[str] = field(default_factory=list)
    external_requests: list[str] = field(default_factory=list)

    def ready(self) -> None:
        """Wait until the current page's scripts ran: its `load` event fired (deferred scripts
        such as htmx executed and attached their listeners on DOMContentLoaded before it) and
        htmx, when the page includes it, is defined. Every step after a navigation goes
        through here: filling a field before htmx listens sends no request."""
        self.page.wait_for_load_state("load")
        self.page.wait_for_function(PAGE_READY)

    def go(self, path: str) -> Any:
        """Navigate to `path` on the live server; the response, once the page is ready."""
        response = self.page.goto(self.base_url + path, wait_until="load")
        self.ready()
        return response

    def follow(self, selector: str, *, url: Any = None) -> None:
        """Click a link or submit button that navigates (to `url`, a string or pattern, when
        given: e.g. the page a POST redirects to) and wait until the new page is ready."""
        with self.page.expect_navigation(url=url, wait_until="load"):
            self.page.click(selector)
        self.ready()

    def login(self, username: str, password: str) -> None:
        self.go("/login/")
        self.page.fill("input[name=username]", username)
        self.page.fill("input[name=password]", password)
        self.follow("button[type=submit]", url=self.base_url + "/")

    def screenshot(self, name: str, *, full_page: bool = True) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.page.evaluate("window.scrollTo(0, 0)")
        self.page.screenshot(path=str(path), full_page=full_page)
        return path

    def assert_clean(self) -> None:
        assert self.external_requests == [], f"requests left localhost: {self.external_requests}"
        assert self.console_errors == [], f"console errors: {self.console_errors}"


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (Debian's package; never a downloaded browser)."""
    executable = shutil.which("chromium")
    require_service("Chromium", executable is not None, "apt-get install -y chromium")
    # Playwright's sync API runs an event loop in this thread; the ORM calls tests make
    # between browser steps are synchronous and safe here.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            browser.close()


def close_pages(browser: Any) -> None:
    """Close every page of `browser`: a page left open keeps polling the live server, whose
    reads hold table locks that the test database's flush (TRUNCATE) deadlocks with."""
    for context in list(browser.contexts):
        context.close()


def watched(browser: Any, base_url: str, *, width: int = 1440, height: int = 900) -> Watched:
    context = browser.new_context(viewport={"width": width, "height": height})
    context.set_default_timeout(30_000)
    page = context.new_page()
    seen = Watched(context, page, base_url.rstrip("/"))

    def route(route: Any) -> None:
        url = route.request.url
        host = urlparse(url).hostname or ""
        if url.startswith(("data:", "blob:")) or host in LOCAL_HOSTS:
            route.continue_()
        else:
            seen.external_requests.append(url)
            route.abort()

    context.route("**/*", route)
    page.on("console", lambda m: seen.console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: seen.console_errors.append(f"uncaught: {exc}"))
    return seen
