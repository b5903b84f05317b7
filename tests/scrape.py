"""Scrape `GET /metrics` as Prometheus does, in the test process, against the test database.

Independent of how the endpoint builds its answer: a bearer token (`EPOCHAL_METRICS_TOKEN`),
a 200 in the text exposition format that parses, and the documented
`epochal_operations{kind,state}` counting the operation that just finished."""

from __future__ import annotations

from django.test import Client
from django.test.utils import override_settings
from prometheus_client.parser import text_string_to_metric_families

TOKEN = "scrape-in-tests"


def scrape_metrics(after_kind: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Scrape /metrics after an operation of `after_kind` succeeded; the samples by name and
    sorted labels. Fails naming the operation when the scrape does not answer 200."""
    with override_settings(EPOCHAL_METRICS_TOKEN=TOKEN):
        response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    body = response.content.decode(errors="replace")
    assert response.status_code == 200, (
        f"/metrics after {after_kind}: {response.status_code}\n{body[:2000]}"
    )
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }
    succeeded = got.get(("epochal_operations", (("kind", after_kind), ("state", "succeeded"))), 0)
    assert succeeded >= 1, f"/metrics after {after_kind} counts no succeeded {after_kind}:\n{body}"
    return got
