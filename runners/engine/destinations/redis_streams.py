"""An exactly-once Redis Streams sink: explicit entry ids derived from the epoch.

Each row of an epoch becomes one stream entry ``{<payload_field>: <row as JSON>, "epoch":
<epoch>}`` whose id is the row's position (log_records.py): ``<ms>-<seq>`` with ``ms * 10**6 +
seq = (generation + epoch) * 10**12 + index``. Redis refuses an ``XADD`` whose id is not above
the stream's last one, so a repeated commit cannot add an entry twice, and `RedisStreamSource`
reads the entries back in order with the ids as offsets.

- **prepare** (before the snapshot's CAS) encodes the epoch's rows and fixes the generation
  from the stream's last id; nothing is written, readers see nothing.
- **commit** (after the CAS) adds the entries after the stream's last id, `batch_size` per
  atomic Lua call, and the last call also sets the *marker* key ``<stream>#epochal`` to
  ``{identity, epoch, snapshot, generation}``: the stream holds that snapshot's epoch. A run
  killed inside the commit left a prefix of the epoch; repeating it adds the rest.
- **committed** reads the marker. A stream is written by one branch: prepare refuses a stream
  whose marker names another.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from runners.engine.crash import maybe_crash
from runners.engine.destinations.fields import check_password_env, check_positive, with_password
from runners.engine.destinations.log_records import (
    SLOT,
    LogSink,
    encoded_rows,
    identity,
    position,
    stage,
)
from runners.engine.redis_stream import decode_id, encode_id
from runners.engine.sinks import EpochOutput, Held

KIND = "redis_streams"
MARKER_SUFFIX = "#epochal"
log = logging.getLogger(__name__)

#: KEYS: stream, marker; ARGV: payload field, epoch, marker JSON ("" but in the last call),
#: then (id, payload) pairs. An id a concurrent call added already is skipped, not doubled.
_ADD = """
local added = 0
for i = 4, #ARGV, 2 do
  local ok = redis.pcall('XADD', KEYS[1], ARGV[i], ARGV[1], ARGV[i + 1], 'epoch', ARGV[2])
  if type(ok) == 'table' and ok.err then
    if not string.find(ok.err, 'equal or smaller', 1, true) then
      return redis.error_reply(ok.err)
    end
  else
    added = added + 1
  end
end
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[2], ARGV[3])
end
return added
"""


@dataclass
class RedisStreamsSink(LogSink):
    """Writes each epoch's output rows to the Redis stream `stream` at `url` exactly once."""

    KIND: ClassVar[str] = KIND
    REQUIRED: ClassVar[dict[str, type]] = {"url": str, "stream": str}
    OPTIONAL: ClassVar[dict[str, type]] = {
        "payload_field": str, "batch_size": int, "password_env": str,
    }  # fmt: skip

    url: str
    stream: str
    payload_field: str = "data"
    batch_size: int = 5_000
    #: the environment variable holding the password (never in `url`)
    password_env: str = ""
    name: str = KIND
    _prepared: dict[tuple[str, str, int], list[bytes]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _client: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(
                f"sink {self.name!r} ({KIND}): field 'url' must be redis://host:port/db, "
                f"rediss://… or unix://…, not {self.url!r}"
            )
        if not self.stream or self.stream.endswith((MARKER_SUFFIX, "#entries")):
            raise ValueError(
                f"sink {self.name!r} ({KIND}): field 'stream' must be a key name not ending in "
                f"{MARKER_SUFFIX!r} or '#entries', not {self.stream!r}"
            )
        if not self.payload_field or self.payload_field == "epoch":
            raise ValueError(
                f"sink {self.name!r} ({KIND}): field 'payload_field' must be a name other than "
                f"'epoch', not {self.payload_field!r}"
            )
        check_positive(KIND, self.name, "batch_size", self.batch_size, 100_000)
        check_password_env(KIND, self.name, self.password_env)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_prepared", "_client")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _prepared={}, _client=None)

    @property
    def marker_key(self) -> str:
        return self.stream + MARKER_SUFFIX

    def redis(self) -> Any:
        if self._client is None:
            import redis

            url = with_password(self.url, self.password_env, KIND, self.name)
            self._client = redis.Redis.from_url(url, socket_timeout=30, socket_connect_timeout=5)
        return self._client

    def _describe(self) -> str:
        return f"sink {self.name!r}: Redis stream {self.stream!r} at {self.url}"

    def top(self) -> int:
        """The position of the stream's last entry id (0: no stream yet)."""
        import redis

        try:
            info = self.redis().xinfo_stream(self.stream)
        except redis.ResponseError as exc:
            if "no such key" in str(exc):
                return 0
            raise ValueError(f"{self._describe()}: {exc}") from None
        return encode_id(info["last-generated-id"])

    def marker(self) -> dict[str, Any] | None:
        raw = self.redis().get(self.marker_key)
        return None if raw is None else dict(json.loads(raw))

    def check(self) -> None:
        """ValueError unless the server answers and the key is a stream (or absent): before a
        job starts."""
        try:
            self.top()
        except ValueError:
            raise
        except Exception as exc:
            raise ValueError(f"{self._describe()} (field 'url') is unreachable: {exc}") from None

    # -- the Sink protocol -------------------------------------------------------------------

    def prepare(self, output: EpochOutput) -> dict[str, Any]:
        writer = identity(output.namespace, output.branch)
        try:
            marker, top = self.marker(), self.top()
        except ValueError:
            raise
        except Exception as exc:  # down: the commit finds it when it is back
            log.warning("%s: unreachable at prepare (%s)", self._describe(), exc)
            marker, top = None, 0
        if marker is not None and marker.get("identity") != writer:
            raise ValueError(
                f"{self._describe()} is written by {marker.get('identity')!r}, not {writer!r}: "
                "a stream has one writing branch; give this branch's version its own stream"
            )
        rows, record = stage(output, self.name, self.stream, top)
        self._prepared[(output.namespace, output.branch, output.epoch)] = rows
        return record

    def commit(self, output: EpochOutput, pending: Mapping[str, Any]) -> None:
        if output.snapshot_id is None:
            raise ValueError("commit needs the snapshot that committed the epoch")
        key = (output.namespace, output.branch, output.epoch)
        rows = self._prepared.pop(key, None)
        marker = self.marker()
        if marker is not None and marker.get("snapshot") == output.snapshot_id:
            return  # done already
        if rows is None:  # prepared by a process that is gone: the rows again, from the store
            rows = encoded_rows(output)
        gen = int(pending["generation"])
        done = json.dumps({"identity": str(pending["identity"]), "epoch": output.epoch,
                           "snapshot": output.snapshot_id, "generation": gen})  # fmt: skip
        top = self.top()
        first = position(gen, output.epoch, 0)
        start = max(0, top - first + 1) if top >= first else 0
        script = self.redis().register_script(_ADD)
        keys = [self.stream, self.marker_key]
        epoch = str(output.epoch)
        if start >= len(rows):  # every entry is there (or the epoch has none): the marker
            script(keys=keys, args=[self.payload_field, epoch, done])
            return
        for begin in range(start, len(rows), self.batch_size):
            end = min(begin + self.batch_size, len(rows))
            args: list[Any] = [self.payload_field, epoch, done if end == len(rows) else ""]
            for index in range(begin, end):
                args += [decode_id(first + index), rows[index]]
            script(keys=keys, args=args)
            if begin == start:
                maybe_crash(output.crash, "mid_sink_commit", output.epoch)

    def committed(self, pending: Mapping[str, Any]) -> Held | None:
        marker = self.marker()
        if marker is None or marker.get("identity") != pending.get("identity"):
            return None
        return Held(int(marker["epoch"]), str(marker["snapshot"]))

    def published(self) -> dict[int, list[dict[str, Any]]]:
        """The stream's rows per epoch (the entries' ``epoch`` field), every entry of it."""
        epochs: dict[int, list[dict[str, Any]]] = {}
        cursor, page_size = "-", 10_000
        while True:
            page = self.redis().xrange(self.stream, cursor, "+", count=page_size)
            for _, fields in page:
                row = json.loads(fields[self.payload_field.encode()])
                epochs.setdefault(int(fields[b"epoch"]), []).append(row)
            if len(page) < page_size:
                return epochs
            cursor = "(" + page[-1][0].decode()

    def close(self) -> None:
        self._prepared.clear()
        if self._client is not None:
            self._client.close()
            self._client = None


assert SLOT % 10**6 == 0  # a slot is whole milliseconds of entry ids

__all__ = ["RedisStreamsSink"]
