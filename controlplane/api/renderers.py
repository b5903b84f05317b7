"""The API's JSON renderer: DRF's `JSONRenderer`, encoding with orjson (a C encoder, several
times faster than `json.dumps` with DRF's encoder class) when the answer is compact JSON.

The bytes are DRF's for the same data, but for two things: floats are spelled as orjson
spells them where both are valid JSON for the same number (``1e16`` for ``1e+16``, ``1e-7``
for ``1e-07``), and a NaN or infinity is written ``null`` where DRF's strict JSON failed the
request (the API's parser refuses them on the way in). Keys keep their order, non-ASCII is
written as is, U+2028 and U+2029 are escaped, and what orjson does not encode itself
(datetimes, decimals, lazy strings, …) goes through DRF's encoder
(`rest_framework.utils.encoders.JSONEncoder.default`), so datetimes read the same. What
orjson refuses (integers beyond 64 bits, lone surrogates) and indented answers
(``Accept: application/json; indent=2``) are rendered by DRF's own path, unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from rest_framework.renderers import JSONRenderer
from rest_framework.utils.encoders import JSONEncoder

_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS
_DEFAULT = JSONEncoder().default
_LS, _PS = "\u2028".encode(), "\u2029".encode()


class FastJSONRenderer(JSONRenderer):
    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        if data is None:
            return b""
        context = renderer_context or {}
        if self.compact and self.get_indent(accepted_media_type or "", context) is None:
            try:
                body = orjson.dumps(data, default=_DEFAULT, option=_OPTIONS)
            except orjson.JSONEncodeError:
                pass  # DRF's path renders it (or fails) as it always did
            else:
                if _LS in body or _PS in body:
                    body = body.replace(_LS, b"\\u2028").replace(_PS, b"\\u2029")
                return body
        return super().render(data, accepted_media_type, renderer_context)  # type: ignore[no-any-return]
