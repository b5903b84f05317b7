"""Whole-string matching: the one way a regular expression checks input.

A pattern that validates a value must match all of it. Python's ``re.match`` and
``re.search`` do not: ``$`` also matches before a trailing newline, so ``^main$`` accepts
``"main\\n"``. Every validator (names, revisions, Spark settings, the operations' JSON schemas,
Django and DRF field validators) asks `whole_match`, which uses ``fullmatch``; the patterns
keep their ``^…$`` so that the OpenAPI schema publishes them as they are (in ECMAScript, the
schema's dialect, ``$`` without the ``m`` flag is the end of the input).
``tests/security/test_whole_string.py`` scans the code for anchored patterns used otherwise.
"""

from __future__ import annotations

import re
from functools import lru_cache

Pattern = str | re.Pattern[str]


@lru_cache(maxsize=512)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def compiled(pattern: Pattern) -> re.Pattern[str]:
    """`pattern` compiled (kept: validators ask many times)."""
    return pattern if isinstance(pattern, re.Pattern) else _compiled(pattern)


def whole_match(pattern: Pattern, value: object) -> re.Match[str] | None:
    """The match of `pattern` over all of `value` (None when `value` is not a string or any
    character of it, a trailing newline included, is left over)."""
    if not isinstance(value, str):
        return None
    return compiled(pattern).fullmatch(value)
