"""The serving store's layout for a counting job, and the queries on it.

Per job NAME, in Redis:
- ``kf:NAME:w:<key>``: a hash, one field per window start (epoch ms), holding JSON
  ``{"end", "count", "version", "final"}``: the current count of every window of the key;
- ``kf:NAME:keys``: the set of keys; ``kf:NAME:open``: windows not forgotten yet;
- ``kf:NAME:stats``: events counted, duplicates, late, dead letters, last batch, watermark.

Every write is idempotent: a window's value is replaced only by a higher version, and the
statistics move only for a batch id higher than the last one applied. So re-running a
batch after a crash changes nothing that was already applied.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis

from kappaflow.timeutil import from_epoch_ms, iso

# Applies one batch's changes. ARGV: job, batch id, changes (JSON), closed windows (JSON),
# statistics (JSON, or "" for a chunk that is not the batch's last).
APPLY = """
local job, batch = ARGV[1], tonumber(ARGV[2])
local prefix = 'kf:' .. job .. ':'
local applied = 0
for _, c in ipairs(cjson.decode(ARGV[3])) do
  local hash = prefix .. 'w:' .. c[1]
  local field = tostring(c[2])
  local current = redis.call('HGET', hash, field)
  if (not current) or cjson.decode(current).version < c[5] then
    redis.call('HSET', hash, field, cjson.encode(
      {['end'] = c[3], count = c[4], version = c[5], final = c[6]}))
    applied = applied + 1
  end
  redis.call('SADD', prefix .. 'keys', c[1])
  if not c[6] then redis.call('SADD', prefix .. 'open', field .. '|' .. c[1]) end
end
for _, w in ipairs(cjson.decode(ARGV[4])) do
  redis.call('SREM', prefix .. 'open', tostring(w[2]) .. '|' .. w[1])
end
if ARGV[5] ~= '' then
  local stats = prefix .. 'stats'
  local last = tonumber(redis.call('HGET', stats, 'last_batch') or '-1')
  if batch > last then
    local s = cjson.decode(ARGV[5])
    for _, name in ipairs({'counted', 'duplicates', 'late', 'dlq'}) do
      redis.call('HINCRBY', stats, name, s[name])
    end
    redis.call('HSET', stats, 'last_batch', batch)
    if s.watermark > tonumber(redis.call('HGET', stats, 'watermark') or '0') then
      redis.call('HSET', stats, 'watermark', s.watermark)
    end
  end
end
return applied
"""

CHUNK = 5000


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
        self._apply = client.register_script(APPLY)

    def apply(
        self,
        batch_id: int,
        changes: list[tuple[str, int, int, int, int, bool]],
        closed: list[tuple[str, int]],
        stats: dict[str, int],
    ) -> int:
        """Apply a batch: (key, start, end, count, version, final) changes; idempotent."""
        applied = 0
        chunks = [changes[i : i + CHUNK] for i in range(0, len(changes), CHUNK)] or [[]]
        for number, chunk in enumerate(chunks):
            last = number == len(chunks) - 1
            applied += int(
                self._apply(
                    args=[
                        self.job,
                        batch_id,
                        json.dumps(chunk),
                        json.dumps(closed if last else []),
                        json.dumps(stats) if last else "",
                    ]
                )
            )
        return applied

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
        values["open_windows"] = int(self.client.scard(self.prefix + "open"))
        return values

    def drop(self) -> None:
        """Forget everything this job stored."""
        for name in self.client.scan_iter(match=self.prefix + "*", count=1000):
            self.client.delete(name)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
