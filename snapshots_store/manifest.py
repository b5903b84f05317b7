"""The manifest: one per snapshot, naming its parents, offsets, key-group chunks and outputs.

`Manifest` is a frozen dataclass; its payload is canonical JSON (sorted keys, no spaces,
UTF-8), so equal manifests have equal ids. Construction and `from_bytes` validate every
field and raise `MalformedManifestError` naming the field at fault.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from snapshots_store.codec import JSON, canonical_json, parse_timestamp, utc_now_iso
from snapshots_store.errors import InvalidNameError, MalformedManifestError
from snapshots_store.names import check_branch_name
from snapshots_store.objects import is_object_id
from snapshots_store.packs import is_chunk_ref, is_packed

#: format 2 adds packed chunk refs (``<pack id>:<key group>``) to key-group chains; a manifest
#: without them is written as format 1, byte for byte what earlier versions wrote
FORMAT: Final = 2
FORMATS: Final = (1, 2)
MAX_PARALLELISM_LIMIT: Final = 32768
COMMIT_KINDS: Final = frozenset(
    {"initial", "epoch", "rescale", "rollback", "fork", "migration", "savepoint"}
)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """One snapshot. Values are normalised on construction and must not be mutated.

    Any sequences are accepted; stored are tuples: `parents`, `outputs` and the chunk lists
    of `key_groups` (int key group -> chunk ids, sorted by key group); `offsets` maps
    source -> partition (str) -> end offset. The JSON form uses lists and string keys
    (see docs/store-format.md).
    """

    branch: str
    epoch: int
    max_parallelism: int
    parallelism: int
    kind: str
    parents: Sequence[str] = ()
    offsets: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    key_groups: Mapping[int, Sequence[str]] = field(default_factory=dict)
    outputs: Sequence[str] = ()
    code_version: str = ""
    config_hash: str = ""
    operation_id: str | None = None
    created_at: str = field(default_factory=utc_now_iso)
    processing_time_ms: int = 0
    stats: Mapping[str, int | float] = field(default_factory=dict)
    provenance: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, JSON] = field(default_factory=dict)
    #: 0 = the lowest format that holds the manifest (1 unless a chain names a pack member)
    format: int = 0

    def __post_init__(self) -> None:
        _validate(self)

    def __hash__(self) -> int:
        return hash(self.to_bytes())

    # -- encoding ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, JSON]:
        """The JSON form (string keys, lists) — what `to_bytes` serialises."""
        return {
            "format": self.format,
            "parents": list(self.parents),
            "branch": self.branch,
            "epoch": self.epoch,
            "offsets": {s: dict(parts) for s, parts in self.offsets.items()},
            "max_parallelism": self.max_parallelism,
            "parallelism": self.parallelism,
            "key_groups": {str(g): list(c) for g, c in self.key_groups.items()},
            "outputs": list(self.outputs),
            "code_version": self.code_version,
            "config_hash": self.config_hash,
            "kind": self.kind,
            "operation_id": self.operation_id,
            "created_at": self.created_at,
            "processing_time_ms": self.processing_time_ms,
            "stats": dict(self.stats),
            "provenance": dict(self.provenance),
            "extra": dict(self.extra),
        }

    def to_bytes(self) -> bytes:
        return canonical_json(self.to_dict())

    @classmethod
    def from_dict(cls, doc: object, snapshot_id: str | None = None) -> Manifest:
        if not isinstance(doc, dict):
            raise MalformedManifestError("(document)", "must be a JSON object", snapshot_id)
        expected = set(_FIELDS)
        unknown = sorted(set(doc) - expected)
        if unknown:
            raise MalformedManifestError(unknown[0], "is not a manifest field", snapshot_id)
        missing = sorted(expected - set(doc))
        if missing:
            raise MalformedManifestError(missing[0], "is missing", snapshot_id)
        if doc["format"] not in FORMATS or not _is_int(doc["format"]):
            raise MalformedManifestError(
                "format", f"is {doc['format']!r}; this library reads formats {FORMATS}", snapshot_id
            )
        for name in ("parents", "outputs"):
            if not isinstance(doc[name], list):
                raise MalformedManifestError(name, "must be a list of object ids", snapshot_id)
        key_groups = doc["key_groups"]
        if not isinstance(key_groups, dict):
            raise MalformedManifestError("key_groups", "must be an object", snapshot_id)
        groups: dict[int, Any] = {}
        for raw, chunks in key_groups.items():
            if not (raw.isascii() and raw.isdigit()) or str(int(raw)) != raw:
                raise MalformedManifestError(
                    "key_groups", f"has key {raw!r}; keys are decimal integers", snapshot_id
                )
            if not isinstance(chunks, list):
                raise MalformedManifestError(
                    f"key_groups.{raw}", "must be a list of chunk ids", snapshot_id
                )
            groups[int(raw)] = chunks
        kwargs = {name: doc[name] for name in _FIELDS}
        kwargs["parents"] = tuple(doc["parents"])
        kwargs["outputs"] = tuple(doc["outputs"])
        kwargs["key_groups"] = groups
        try:
            return cls(**kwargs)
        except MalformedManifestError as exc:
            if snapshot_id is None:
                raise
            raise MalformedManifestError(exc.field, exc.detail, snapshot_id) from None

    @classmethod
    def from_bytes(cls, data: bytes, snapshot_id: str | None = None) -> Manifest:
        """Parse and validate a manifest payload."""
        try:
            doc = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
        except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
            raise MalformedManifestError(
                "(document)", f"is not UTF-8 JSON ({exc})", snapshot_id
            ) from None
        return cls.from_dict(doc, snapshot_id)

    def with_changes(self, **changes: Any) -> Manifest:
        """A copy with some fields replaced (validated like a new manifest)."""
        values = {name: getattr(self, name) for name in _FIELDS}
        values.update(changes)
        return Manifest(**values)


_FIELDS: Final = (
    "format",
    "parents",
    "branch",
    "epoch",
    "offsets",
    "max_parallelism",
    "parallelism",
    "key_groups",
    "outputs",
    "code_version",
    "config_hash",
    "kind",
    "operation_id",
    "created_at",
    "processing_time_ms",
    "stats",
    "provenance",
    "extra",
)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def _fail(field_name: str, detail: str) -> MalformedManifestError:
    return MalformedManifestError(field_name, detail)


def _set(m: Manifest, name: str, value: object) -> None:
    object.__setattr__(m, name, value)


def _ids(name: str, value: object, *, unique: bool) -> tuple[str, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise _fail(name, "must be a list of object ids")
    items = tuple(value)
    for item in items:
        if not is_object_id(item):
            raise _fail(name, f"contains {item!r}, not an object id (64 lowercase hex)")
    if unique and len(set(items)) != len(items):
        raise _fail(name, "lists an object id twice")
    return items


def _refs(name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise _fail(name, "must be a list of chunk refs")
    items = tuple(value)
    for item in items:
        if not is_chunk_ref(item):
            raise _fail(
                name, f"contains {item!r}, not a chunk ref (object id or <pack id>:<key group>)"
            )
    return items


def _validate(m: Manifest) -> None:
    if not _is_int(m.format) or m.format not in (0, *FORMATS):
        raise _fail("format", f"is {m.format!r}; this library writes formats {FORMATS}")
    _set(m, "parents", _ids("parents", m.parents, unique=True))
    try:
        check_branch_name(m.branch)
    except InvalidNameError as exc:
        raise _fail("branch", f"is invalid: {exc.reason}") from None
    if not _is_int(m.epoch) or m.epoch < 0:
        raise _fail("epoch", f"is {m.epoch!r}; must be an integer >= 0")
    if not _is_int(m.max_parallelism) or not 1 <= m.max_parallelism <= MAX_PARALLELISM_LIMIT:
        raise _fail(
            "max_parallelism", f"is {m.max_parallelism!r}; must be 1..{MAX_PARALLELISM_LIMIT}"
        )
    if not _is_int(m.parallelism) or not 1 <= m.parallelism <= m.max_parallelism:
        raise _fail("parallelism", f"is {m.parallelism!r}; must be 1..max_parallelism")
    _set(m, "offsets", _offsets(m.offsets))
    _set(m, "key_groups", _key_groups(m.key_groups, m.max_parallelism))
    packed = next((g for g, refs in m.key_groups.items() if any(map(is_packed, refs))), None)
    if m.format == 0:
        _set(m, "format", 1 if packed is None else 2)
    elif m.format == 1 and packed is not None:
        raise _fail(f"key_groups.{packed}", "names a pack member, which needs format 2")
    _set(m, "outputs", _ids("outputs", m.outputs, unique=False))
    for name in ("code_version", "config_hash"):
        if not isinstance(getattr(m, name), str):
            raise _fail(name, "must be a string")
    if m.kind not in COMMIT_KINDS:
        raise _fail("kind", f"is {m.kind!r}; must be one of {sorted(COMMIT_KINDS)}")
    if m.operation_id is not None and not isinstance(m.operation_id, str):
        raise _fail("operation_id", "must be a string or null")
    try:
        if not isinstance(m.created_at, str):
            raise ValueError("not a string")
        parse_timestamp(m.created_at)
    except ValueError:
        raise _fail("created_at", f"is {m.created_at!r}; must be an ISO-8601 UTC time") from None
    if not _is_int(m.processing_time_ms) or m.processing_time_ms < 0:
        raise _fail("processing_time_ms", "must be an integer >= 0")
    _set(m, "stats", _stats(m.stats))
    _set(m, "provenance", _str_map("provenance", m.provenance))
    if not isinstance(m.extra, Mapping) or not all(isinstance(k, str) for k in m.extra):
        raise _fail("extra", "must be an object with string keys")
    extra = dict(m.extra)
    try:
        canonical_json(extra)
    except (TypeError, ValueError) as exc:
        raise _fail("extra", f"is not plain JSON ({exc})") from None
    _set(m, "extra", extra)


def _offsets(value: object) -> dict[str, dict[str, int]]:
    if not isinstance(value, Mapping):
        raise _fail("offsets", "must map source -> partition -> offset")
    result: dict[str, dict[str, int]] = {}
    for source, parts in value.items():
        if not isinstance(source, str) or not source:
            raise _fail("offsets", f"has source {source!r}; sources are non-empty strings")
        if not isinstance(parts, Mapping):
            raise _fail(f"offsets.{source}", "must map partition -> offset")
        inner: dict[str, int] = {}
        for partition, offset in parts.items():
            if _is_int(partition):
                partition = str(partition)
            if not isinstance(partition, str) or not partition:
                raise _fail(f"offsets.{source}", f"has partition {partition!r}")
            if not _is_int(offset) or offset < 0:
                raise _fail(f"offsets.{source}.{partition}", f"is {offset!r}; must be int >= 0")
            inner[partition] = offset
        result[source] = inner
    return result


def _key_groups(value: object, max_parallelism: int) -> dict[int, tuple[str, ...]]:
    if not isinstance(value, Mapping):
        raise _fail("key_groups", "must map key group -> list of chunk ids")
    result: dict[int, tuple[str, ...]] = {}
    for group, chunks in value.items():
        if isinstance(group, str) and group.isascii() and group.isdigit():
            group = int(group)
        if not _is_int(group) or not 0 <= group < max_parallelism:
            raise _fail("key_groups", f"has key group {group!r}; must be 0..max_parallelism-1")
        if group in result:
            raise _fail("key_groups", f"lists key group {group} twice")
        items = _refs(f"key_groups.{group}", chunks)
        if not items:
            raise _fail(f"key_groups.{group}", "is empty; omit a key group with empty state")
        result[group] = items
    return dict(sorted(result.items()))


def _stats(value: object) -> dict[str, int | float]:
    if not isinstance(value, Mapping):
        raise _fail("stats", "must map name -> number")
    result: dict[str, int | float] = {}
    for name, number in value.items():
        ok = _is_int(number) or (isinstance(number, float) and math.isfinite(number))
        if not isinstance(name, str) or not ok:
            raise _fail(f"stats.{name}", f"is {number!r}; must be a finite number")
        result[name] = number
    return result


def _str_map(field_name: str, value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise _fail(field_name, "must map string -> string")
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise _fail(f"{field_name}.{key}", "must be a string")
    return dict(value)
