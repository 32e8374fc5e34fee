"""A counting job's results in the serving store, and the queries on them.

A counting job is a job on the job API (job.py) whose one output is ``counts``, so its
results have that output's layout (streams/output/backends.py ``RedisStore``), under
``kf:NAME:counts:``:
- ``w:["<key>"]``: a hash, one field per window start (epoch ms), holding JSON
  ``{"end", "values": {"count"}, "version", "final"}``;
- ``keys``: the set of keys (each a JSON array of one string);
- ``stats``: events counted, duplicates, late, dead letters, the last batch applied and
  the highest watermark;
- ``open``: window start → how many keys the job's state holds for it (windows not
  forgotten yet; sessions all under ``-2``), which shows the state bounded by the
  watermark.

This module reads them; the job's batch writer writes them, idempotently.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis

from kappaflow.counting.job import OUTPUT
from kappaflow.serving.client import drop_job_keys, redis_prefix
from kappaflow.streams.kinds import SESSIONS_WINDOW
from kappaflow.timeutil import from_epoch_ms, iso


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
    """A counting job's windows and statistics in Redis."""

    def __init__(self, client: redis.Redis, job: str) -> None:
        self.client = client
        self.job = job
        self.prefix = redis_prefix(job, OUTPUT)

    def windows(self, key: str | None = None) -> Iterator[WindowCount]:
        keys = (
            [key]
            if key is not None
            else sorted(json.loads(_text(k))[0] for k in self.client.smembers(self.prefix + "keys"))
        )
        for name in keys:
            fields = self.client.hgetall(
                self.prefix + "w:" + json.dumps([name], ensure_ascii=False)
            )
            for start in sorted(fields, key=int):
                value = json.loads(fields[start])
                yield WindowCount(
                    name,
                    int(start),
                    int(value["end"]),
                    int(value["values"]["count"]),
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
            counted=raw.get("events", 0),
            duplicates=raw.get("duplicates", 0),
            late=raw.get("late", 0),
            dead_letters=raw.get("dead_letters", 0),
            last_batch=raw.get("batch", -1),
            watermark_ms=raw.get("watermark", 0),
            open_windows=open_windows,
            window_keys=window_keys,
        )

    def drop(self) -> None:
        """Forget everything this job stored."""
        drop_job_keys(self.client, self.job)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
