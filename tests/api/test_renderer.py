"""The API's orjson renderer writes DRF's bytes for the data the API renders."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from django.utils.functional import lazy
from rest_framework.renderers import JSONRenderer
from rest_framework.utils.serializer_helpers import ReturnDict, ReturnList

from controlplane.api.renderers import FastJSONRenderer

_lazy_text = lazy(lambda: "lazy é", str)

CASES: list[Any] = [
    {"next": None, "previous": None, "results": []},
    {"b": 1, "a": [1, 2.5, -0.0, 0.1, True, False, None], "c": {"x": "y"}},
    {"text": 'quotes " and \\ and \n\t\x00\x1f, é, 🚀, \u2028 and \u2029, </script>'},
    {
        "aware": datetime(2026, 11, 27, 8, 0, 0, 123456, tzinfo=UTC),
        "whole": datetime(2026, 11, 27, 8, 0, 0, tzinfo=UTC),
        "offset": datetime(2026, 11, 27, 8, 0, tzinfo=timezone(timedelta(hours=2))),
        "naive": datetime(2026, 11, 27, 8, 0, 0, 5),
        "day": date(2026, 11, 27),
        "span": timedelta(seconds=90),
    },
    {"money": Decimal("1.25"), "id": uuid.UUID(int=7), "lazy": _lazy_text(), "raw": b"bytes"},
    ReturnDict({"k": ReturnList([1, {"n": 2}], serializer=None)}, serializer=None),
    {1: "int key", "s": (1, 2)},
    {"huge": 2**70},  # beyond orjson: DRF's path
    [{"epoch": 2**63 - 1, "generation": 0}],
]


@pytest.mark.parametrize("data", CASES)
def test_the_same_bytes_as_drf(data: Any) -> None:
    assert FastJSONRenderer().render(data, "application/json") == JSONRenderer().render(
        data, "application/json"
    )


def test_indented_answers_and_none_take_drf_path() -> None:
    data = {"a": [1, {"b": "c"}]}
    media = "application/json; indent=2"
    assert FastJSONRenderer().render(data, media) == JSONRenderer().render(data, media)
    assert FastJSONRenderer().render(None) == b""
