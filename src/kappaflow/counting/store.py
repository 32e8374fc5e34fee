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

import pyarrow as pa
import redis

from kappaflow.counting.json_columns import (
    booleans,
    json_items,
    number_text,
    quoted,
    string_literals,
)
from kappaflow.counting.rows import SESSIONS_WINDOW
from kappaflow.timeutil import from_epoch_ms, iso

# Writes a chunk of window changes in order. ARGV: job, a JSON array holding six strings
# per change: key, window start, end, count, version, final ("true"/"false"). A count of
# 0 removes the window (a session merged into another). One argument instead of six per
# change: the client spends its time packing arguments, Redis's cjson does not.
WRITE = """
local prefix = 'kf:' .. ARGV[1] .. ':'
local items = cjson.decode(ARGV[2])
local last
for i = 1, #items, 6 do
  local key, start, count = items[i], items[i + 1], items[i + 3]
  local name = prefix .. 'w:' .. key
  if count == '0' then
    redis.call('HDEL', name, start)
  else
    redis.call('HSET', name, start, '{"end": ' .. items[i + 2] .. ', "count": ' .. count ..
      ', "version": ' .. items[i + 4] .. ', "final": ' .. items[i + 5] .. '}')
  end
  if key ~= last then
    redis.call('SADD', prefix .. 'keys', key)
    last = key
  end
end
return #items / 6
"""

# Applies one batch's bookkeeping, once: statistics, and per window how many keys the
# state holds. ARGV: job, batch id, statistics (JSON), {window start: key delta} (JSON).
BOOKKEEP = """
local job, batch = ARGV[1], tonumber(ARGV[2])
local prefix = 'kf:' .. job .. ':'
local stats = prefix .. 'stats'
local last = tonumber(redis.call('HGET', stats, 'last_batch') or '-1')
if batch <= last then return 0 end
local s = cjson.decode(ARGV[3])
for _, name in ipairs({'counted', 'duplicates', 'late', 'dead_letters'}) do
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

#: Changes per call of the write script: large enough that the calls' overhead vanishes,
#: small enough that Redis, which serves no one else during a script, stays responsive.
CHUNK = 10_000


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


@dataclass(frozen=True)
class CountStats:
    """A counting job's bookkeeping, as of the last batch it applied to the store."""

    counted: int
    duplicates: int
    late: int
    dead_letters: int
    #: The last batch applied (-1 before the first).
    last_batch: int
    #: The highest watermark a batch has reported (epoch ms; 0 before the first).
    watermark_ms: int
    #: Windows the job's state still holds, and their (key, window) pairs.
    open_windows: int
    window_keys: int

    @property
    def accounted(self) -> int:
        """Every event read ends up in exactly one of these."""
        return self.counted + self.duplicates + self.late + self.dead_letters


class CountStore:
    def __init__(self, client: redis.Redis, job: str) -> None:
        self.client = client
        self.job = job
        self.prefix = f"kf:{job}:"
        self._write = client.register_script(WRITE)
        self._bookkeep = client.register_script(BOOKKEEP)

    def apply(
        self,
        batch_id: int,
        changes: pa.Table,
        key_deltas: dict[int, int],
        stats: dict[str, int],
    ) -> bool:
        """Apply a batch: its changes, then its bookkeeping; False if already applied.

        ``changes`` has columns ``key``, ``window_start``, ``window_end``, ``count``,
        ``version`` and ``final``, in version order per (key, window): the last change of
        a window is the one that stays. A batch re-run after a crash computes the same
        changes from the same input and state, so writing them again leaves the same
        values: the changes need no fence. The bookkeeping adds up, so it is fenced by
        the batch id.
        """
        items = json_items(
            [
                string_literals(changes["key"]),
                *(
                    quoted(number_text(changes[name]))
                    for name in ("window_start", "window_end", "count", "version")
                ),
                quoted(booleans(changes["final"])),
            ]
        ).to_pylist()
        pipe = self.client.pipeline(transaction=False)
        for at in range(0, len(items), CHUNK):
            self._write(args=[self.job, "[" + ",".join(items[at : at + CHUNK]) + "]"], client=pipe)
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

    def stats(self) -> CountStats:
        raw = {_text(k): int(v) for k, v in self.client.hgetall(self.prefix + "stats").items()}
        held = {int(w): int(n) for w, n in self.client.hgetall(self.prefix + "open").items()}
        if SESSIONS_WINDOW in held:  # session windows: each session is a window of one key
            open_windows = window_keys = held[SESSIONS_WINDOW]
        else:
            open_windows, window_keys = len(held), sum(held.values())
        return CountStats(
            counted=raw.get("counted", 0),
            duplicates=raw.get("duplicates", 0),
            late=raw.get("late", 0),
            # "dlq": the field's name in kappaflow 0.1.0's stores.
            dead_letters=raw.get("dead_letters", 0) + raw.get("dlq", 0),
            last_batch=raw.get("last_batch", -1),
            watermark_ms=raw.get("watermark", 0),
            open_windows=open_windows,
            window_keys=window_keys,
        )

    def drop(self) -> None:
        """Forget everything this job stored."""
        for name in self.client.scan_iter(match=self.prefix + "*", count=1000):
            self.client.delete(name)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
