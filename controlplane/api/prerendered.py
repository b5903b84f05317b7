"""Answers whose JSON was built before rendering (by the database): the bytes go out as
they are, without Python objects per row and without the JSON encoder.

`accepts_prerendered(request)` says whether the negotiated representation is plain JSON
(not the browsable API, not ``application/json; indent=…``) and `EPOCHAL_PRERENDERED_JSON`
is on; only then may a view answer
with `prerendered_json`, and otherwise it builds its data as usual. The body is what DRF's
`JSONRenderer` writes for the same data: compact separators, non-ASCII as is, U+2028 and
U+2029 escaped.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from rest_framework.request import Request
from rest_framework.response import Response


def accepts_prerendered(request: Request) -> bool:
    if not settings.EPOCHAL_PRERENDERED_JSON:
        return False
    renderer = getattr(request, "accepted_renderer", None)
    media_type = str(getattr(request, "accepted_media_type", ""))
    return getattr(renderer, "format", None) == "json" and ";" not in media_type


class PrerenderedResponse(Response):
    """A 200 whose body is `body`: DRF's finalize step and Django's render run as for any
    response (post-render callbacks too), but rendering returns these bytes."""

    def __init__(self, body: bytes) -> None:
        super().__init__(status=200)
        self._prerendered = body

    @property
    def rendered_content(self) -> bytes:
        self["Content-Type"] = str(self.accepted_media_type)
        return self._prerendered


def prerendered_json(members: dict[str, Any], raw: dict[str, str]) -> PrerenderedResponse:
    """An object of `members` (encoded here) followed by `raw` members whose values are JSON
    text already, in that order."""
    head = json.dumps(members, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    parts = [head[:-1]] if members else ["{"]
    for n, (name, text) in enumerate(raw.items()):
        parts.append(("," if members or n else "") + json.dumps(name) + ":" + text)
    parts.append("}")
    body = "".join(parts).replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return PrerenderedResponse(body.encode())
