"""Revisions: the one grammar of the names that pick a snapshot, parsed before any I/O.

The syntax is git's (gitrevisions(7)) over the store's names: a base, then any chain of
steps.

- base: a full snapshot id (64 hex digits); ``heads/x``, ``tags/y`` (or ``refs/heads/x``,
  ``refs/tags/y``); a bare branch name, then a bare tag name; a unique id prefix of at least
  `MIN_PREFIX` hex digits. Names follow `snapshots_store.names`.
- ``~N``: the N-th first-parent ancestor; ``~`` is ``~1``; ``~0`` is the snapshot itself.
- ``^N``: the N-th parent (merges have several); ``^`` is ``^1``; ``^0`` is the snapshot itself.
- Steps chain left to right: ``main~2^2~`` is the first parent of the second parent of
  ``main~2``.

As in git, counts are ASCII digits only (leading zeros allowed) and at most `MAX_COUNT`; no
whitespace or control character belongs to a revision (a trailing newline included). Every
user — `Repository.resolve`, the control plane's lineage index (which compiles a parsed
revision to SQL) and the API's validators — parses here; `parse_revision` refuses what is not
a revision with `InvalidRevisionError`, naming the part at fault.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

from snapshots_store.errors import InvalidNameError, InvalidRevisionError
from snapshots_store.names import check_branch_name, check_ref_name
from snapshots_store.objects import is_object_id

MIN_PREFIX: Final = 8
"""The shortest id prefix a revision may use."""
MAX_COUNT: Final = 2**31 - 1
"""The largest step count (git's: a count above INT_MAX is no revision there either)."""
MAX_LENGTH: Final = 1000
"""The longest revision text."""

_STEP: Final = re.compile(r"([~^])([0-9]*)")
_HEX: Final = re.compile(r"[0-9a-f]+")

REVISION_PATTERN: Final = (
    rf"^(?=.{{1,{MAX_LENGTH}}}$)(?!.*\.\.)"
    r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}(/[A-Za-z0-9][A-Za-z0-9._-]{0,99})*([~^][0-9]*)*$"
)
"""The grammar's shape as a regular expression, for published schemas only (OpenAPI speaks
patterns); it accepts every revision and a few texts `parse_revision` refuses (a count above
`MAX_COUNT`, a name ending in ``.lock``) — validators call `parse_revision`."""

StepKind = Literal["~", "^"]


@dataclass(frozen=True)
class Step:
    """``~count`` (first-parent ancestor) or ``^count`` (count-th parent; 0: itself)."""

    kind: StepKind
    count: int

    def __str__(self) -> str:
        return f"{self.kind}{self.count}"


@dataclass(frozen=True)
class Revision:
    """A parsed revision: where to start (`object_id`, else the `refs` in order, else the id
    `prefix`) and the `steps` to take from there."""

    text: str
    base: str
    object_id: str | None
    refs: tuple[str, ...]
    prefix: str | None
    steps: tuple[Step, ...]

    def through(self, taken: int) -> str:
        """The revision's text up to (not including) step `taken`, for messages."""
        return self.base + "".join(str(step) for step in self.steps[:taken])


def parse_revision(text: object) -> Revision:
    """`text` parsed; InvalidRevisionError saying what is wrong when it is no revision."""
    if not isinstance(text, str) or not text:
        raise InvalidRevisionError(repr(text), "a revision is a non-empty string")
    if len(text) > MAX_LENGTH:
        raise InvalidRevisionError(text[:40] + "…", f"longer than {MAX_LENGTH} characters")
    bad = next((c for c in text if c.isspace() or not c.isprintable()), None)
    if bad is not None:
        raise InvalidRevisionError(
            text, f"{bad!r} is not part of a revision (no whitespace or control characters)"
        )
    cut = min((i for i in (text.find("~"), text.find("^")) if i >= 0), default=len(text))
    base, tail = text[:cut], text[cut:]
    steps = _steps(text, tail)
    object_id, refs, prefix = _base(text, base)
    return Revision(text, base, object_id, refs, prefix, steps)


def _steps(text: str, tail: str) -> tuple[Step, ...]:
    steps: list[Step] = []
    at = 0
    while at < len(tail):
        match = _STEP.match(tail, at)
        if match is None:
            raise InvalidRevisionError(
                text,
                f"{tail[at:][:20]!r} is not a step: after the name only ~N or ^N may follow "
                "(N in ASCII digits 0-9, optional)",
            )
        kind, digits = match.group(1), match.group(2)
        at = match.end()
        if at < len(tail) and tail[at] not in "~^":
            raise InvalidRevisionError(
                text,
                f"{kind}{digits} is followed by {tail[at]!r}: a count is ASCII digits 0-9 "
                "and a step is followed only by another ~ or ^",
            )
        significant = digits.lstrip("0")
        if len(significant) > len(str(MAX_COUNT)) or int(significant or 0) > MAX_COUNT:
            raise InvalidRevisionError(
                text, f"the count of {kind}{digits[:20]} is above {MAX_COUNT}, git's limit"
            )
        steps.append(Step(kind, int(digits) if digits else 1))  # type: ignore[arg-type]
    return tuple(steps)


def _base(text: str, base: str) -> tuple[str | None, tuple[str, ...], str | None]:
    if not base:
        raise InvalidRevisionError(text, "a revision starts with a snapshot id, branch or tag")
    if is_object_id(base):
        return base, (), None
    prefix = base if len(base) >= MIN_PREFIX and _HEX.fullmatch(base) else None
    try:
        return None, (check_ref_name(base),), None
    except InvalidNameError:
        pass
    try:
        check_branch_name(base, what="revision")
    except InvalidNameError as exc:
        if prefix is None:
            raise InvalidRevisionError(text, exc.reason) from None
        return None, (), prefix
    return None, (f"heads/{base}", f"tags/{base}"), prefix
