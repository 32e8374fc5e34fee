"""The serving store's layout for a counting job, and the queries on it.

Per job NAME, in Redis:
- ``kf:NAME:w:<key>``: a hash, one field per window start (epoch ms), holding JSON
  ``{"end", "count", "version", "final"}``: the current count of every window of the key;
- ``kf:NAME:keys``: the set of keys;
- ``kf:NAME:open``: a hash, window start → how many keys the job's state holds for it
  (windows not forgotten yet), which shows the state bounded by the watermark;
- ``kf:NAME:stats``: events counted, duplicates, late, dead letters, last batch, watermark.

Every write is idempotent: a re-run batch writes the same window values again, and the
statistics and key counts move only for a batch id higher than the last one applied. So
re-running a batch after a crash changes nothing that was already applied.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis

from kappaflow.timeutil import from_epoch_ms, iso

# Applies one batch's bookkeeping, once: statistics, and per window how many keys the
# state holds. ARGV: job, batch id, statistics (JSON), {window start: key delta} (JSON).
BOOKKEEP = """
local job, batch = ARGV[1], tonumber(ARGV[2])
local prefix = 'kf:' .. job .. ':'
local stats = prefix .. 'stats'
local last = tonumber(redis.call('HGET', stats, 'last_batch') or '-1')
if batch <= last then return 0 end
local s = cjson.decode(ARGV[3])
for _, name in ipairs({'counted', 'duplicates', 'late', 'dlq'}) do
  redis.call('HINCRBY', stats, name, s[name])
end
redis.call('HSET', stats, 'last_batch', batch)
if s.watermark > tonumber(redis.call('HGET', stats, 'watermark') or '0') then
  redis.call('HSET', stats, 'watermark', s.watermark)
end
for window, delta in pairs(cjson.decode(ARGV[4])) do
  if redis.call('HINCRBY', prefix .. 'open', window, delta) <= 0 then
    redis.call('HDEL', prefix .. 'open', window)
  end
end
return 1
"""

#: The ``window_start`` of session jobs' statistics and forgotten sessions: the store
#: counts the sessions held there (each session is one window of one key).
SESSIONS = -2

#: Redis commands sent per round trip.
PIPELINE = 2000


@dataclass(frozen=True)
class Changes:
    """One batch's window changes, as columns, in version order per (key, window)."""

    keys: list[str]
    starts: list[int]
    ends: list[int]
    counts: list[int]
    versions: list[int]
    finals: list[bool]

    def __len__(self) -> int:
        return len(self.keys)


@dataclass(frozen=True)
class WindowCount:
    key: str
    window_start: int
    window_end: int
    count: int
    version: int
    final: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "window_start": iso(from_epoch_ms(self.window_start)),
            "window_end": iso(from_epoch_ms(self.window_end)),
            "count": self.count,
            "final": self.final,
        }


class CountStore:
    def __init__(self, client: redis.Redis, job: str) -> None:
        self.client = client
        self.job = job
        self.prefix = f"kf:{job}:"
        self._bookkeep = client.register_script(BOOKKEEP)

    def apply(
        self,
        batch_id: int,
        changes: Changes,
        key_deltas: dict[int, int],
        stats: dict[str, int],
    ) -> bool:
        """Apply a batch: its changes, then its bookkeeping; False if already applied.

        A batch re-run after a crash computes the same changes from the same input and
        state, so writing them again leaves the same values: the changes need no fence.
        The bookkeeping adds up, so it is fenced by the batch id.
        """
        values: dict[str, dict[str, str | None]] = {}
        for key, start, end, count, version, final in zip(
            changes.keys,
            changes.starts,
            changes.ends,
            changes.counts,
            changes.versions,
            changes.finals,
            strict=True,
        ):
            # The last change of a (key, window) in the batch has its highest version.
            # A session merged into another is retracted to 0: its window is gone.
            values.setdefault(key, {})[str(start)] = (
                f'{{"end": {end}, "count": {count}, "version": {version}, '
                f'"final": {"true" if final else "false"}}}'
                if count
                else None
            )
        names = list(values)
        for at in range(0, len(names), PIPELINE):
            pipe = self.client.pipeline(transaction=False)
            chunk = names[at : at + PIPELINE]
            for key in chunk:
                name = self.prefix + "w:" + key
                kept = {field: v for field, v in values[key].items() if v is not None}
                if kept:
                    pipe.hset(name, mapping=kept)  # type: ignore[arg-type]
                gone = [field for field, v in values[key].items() if v is None]
                if gone:
                    pipe.hdel(name, *gone)
            pipe.sadd(self.prefix + "keys", *chunk)
            pipe.execute()
        return bool(
            self._bookkeep(
                args=[
                    self.job,
                    batch_id,
                    json.dumps(stats),
                    json.dumps({str(w): d for w, d in key_deltas.items() if d}),
                ]
            )
        )

    def windows(self, key: str | None = None) -> Iterator[WindowCount]:
        keys = (
            [key]
            if key is not None
            else sorted(_text(k) for k in self.client.smembers(self.prefix + "keys"))
        )
        for name in keys:
            fields = self.client.hgetall(self.prefix + "w:" + name)
            for start in sorted(fields, key=int):
                value = json.loads(fields[start])
                yield WindowCount(
                    name,
                    int(start),
                    int(value["end"]),
                    int(value["count"]),
                    int(value["version"]),
                    bool(value["final"]),
                )

    def stats(self) -> dict[str, int]:
        raw = self.client.hgetall(self.prefix + "stats")
        values = {_text(k): int(v) for k, v in raw.items()}
        held = {int(w): int(n) for w, n in self.client.hgetall(self.prefix + "open").items()}
        if SESSIONS in held:  # session windows: each session is a window of one key
            values["open_windows"] = values["window_keys"] = held[SESSIONS]
        else:
            values["open_windows"] = len(held)
            values["window_keys"] = sum(held.values())
        return values

    def drop(self) -> None:
        """Forget everything this job stored."""
        for name in self.client.scan_iter(match=self.prefix + "*", count=1000):
            self.client.delete(name)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
