"""The one JSON parser of the API: strict about what it lets through.

Refused with a 400 naming the place (``fields``): bytes that are not UTF-8, text that is not
JSON, `NaN` / `Infinity`, a key given twice in one object (``{"kind": "stop", "kind":
"rescale"}``: which one counts is not for a parser to guess), NUL characters and lone
surrogates in any key or string (PostgreSQL cannot store them), and nesting deeper than
`MAX_DEPTH`. Bodies over the size limit never get
here (`controlplane.api.middleware.BodyLimitMiddleware` answers 413).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from rest_framework.parsers import JSONParser

from controlplane.errors import InvalidRequest

MAX_DEPTH = 32
_FORBIDDEN = re.compile("[\x00\ud800-\udfff]")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


class DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(key)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object from its (key, value) pairs; DuplicateKey when a key comes twice."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise DuplicateKey(key)
        found[key] = value
    return found


def _refuse(message: str, where: str, problem: str, code: str = "malformed_request") -> None:
    raise InvalidRequest(message, code=code, fields={where or "body": [problem]})


def _problem(text: str) -> str:
    char = _FORBIDDEN.search(text)
    assert char is not None
    if char.group() == "\x00":
        return "contains a NUL character (\\u0000), which cannot be stored"
    return f"contains a lone surrogate (\\u{ord(char.group()):04x}); send valid UTF-16 pairs"


def check_json_value(value: Any, path: str = "", depth: int = 1) -> None:
    """Raise `InvalidRequest` naming the first too-deep or unstorable place in `value`."""
    if depth > MAX_DEPTH:
        _refuse(
            f"the JSON body is nested deeper than {MAX_DEPTH} levels at {path or 'the top'}",
            path,
            f"nested deeper than {MAX_DEPTH} levels",
            code="too_deep",
        )
    if isinstance(value, str):
        if _FORBIDDEN.search(value):
            _refuse(f"{path or 'the body'} {_problem(value)}", path, _problem(value))
    elif isinstance(value, Mapping):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if _FORBIDDEN.search(key):
                shown = _FORBIDDEN.sub("?", where)
                _refuse(f"the key {shown!r} {_problem(key)}", shown, "key " + _problem(key))
            check_json_value(item, where, depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_json_value(item, f"{path}.{index}" if path else str(index), depth + 1)


def loads_strict(raw: bytes) -> Any:
    """`raw` as JSON, or `InvalidRequest` saying what is wrong and where."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        _refuse(f"the body is not UTF-8 (byte {exc.start})", "body", "not UTF-8")
    try:
        value = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except DuplicateKey as exc:
        shown = _FORBIDDEN.sub("?", exc.key)[:200]
        _refuse(
            f"the key {shown!r} appears more than once in one JSON object; send it once",
            shown,
            "given more than once",
        )
    except RecursionError:
        _refuse(
            f"the JSON body is nested deeper than {MAX_DEPTH} levels",
            "body",
            f"nested deeper than {MAX_DEPTH} levels",
            code="too_deep",
        )
    except ValueError as exc:
        _refuse(f"the body is not JSON: {exc}", "body", str(exc))
    check_json_value(value)
    return value


class StrictJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        return loads_strict(stream.read() if stream is not None else b"")
