"""Queries over the serving store, for every job's outputs alike.

Every output a job writes to Redis has one layout (streams/output/backends.py ``RedisStore``):
under ``kf:JOB:OUTPUT:``, a hash per key of its windows (``w:KEY``, window start in epoch
ms → ``{"end", "values", "version", "final"}``), the set of keys (``keys``), a keyed
stream's latest record per key (``latest``) and the output's running totals (``stats``).
Keys are JSON arrays of the output's key columns (``["/home"]``, ``["dev-1",
"cpu_temp"]``). These functions read them; nothing here writes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import redis
from redis.client import Pipeline

from kappaflow.errors import ApiBadRequestError
from kappaflow.serving.client import redis_prefix
from kappaflow.timeutil import from_epoch_ms, iso

#: Keys a scan of an output's windows reads per round trip.
_BATCH = 500


@dataclass(frozen=True)
class Window:
    """One window of one key, as the serving store holds it."""

    key: list[Any]
    start: int
    end: int
    values: dict[str, Any]
    version: int
    final: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "window_start": iso(from_epoch_ms(self.start)),
            "window_end": iso(from_epoch_ms(self.end)),
            "values": self.values,
            "final": self.final,
            "version": self.version,
        }


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def outputs(client: redis.Redis, job: str) -> list[str]:
    """The outputs of ``job`` that have written to the store, by name."""
    found: set[str] = set()
    prefix = f"kf:{job}:"
    for name in client.scan_iter(match=f"{_escape(prefix)}*", count=1000):
        rest = _text(name)[len(prefix) :]
        output, _, part = rest.partition(":")
        if part in ("stats", "keys", "latest"):
            found.add(output)
    return sorted(found)


def has_output(client: redis.Redis, job: str, output: str) -> bool:
    """Whether ``output`` of ``job`` has written to the store (without a scan)."""
    prefix = redis_prefix(job, output)
    return bool(client.exists(prefix + "stats", prefix + "keys", prefix + "latest"))


def _escape(pattern: str) -> str:
    """``pattern`` with Redis glob characters taken literally."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in pattern)


def stats(client: redis.Redis, job: str, output: str) -> dict[str, int]:
    """The output's running totals (events, duplicates, late, dead_letters, batch,
    watermark), as its batch writer last applied them."""
    raw = client.hgetall(redis_prefix(job, output) + "stats")
    return {_text(k): int(v) for k, v in raw.items()}


def keys(client: redis.Redis, job: str, output: str) -> list[str]:
    """The output's keys that have windows, as their JSON text, sorted."""
    return sorted(_text(k) for k in client.smembers(redis_prefix(job, output) + "keys"))


def has_key(client: redis.Redis, job: str, output: str, key: str) -> bool:
    """Whether the output has windows for ``key`` (JSON text)."""
    return bool(client.sismember(redis_prefix(job, output) + "keys", key))


def windows(
    client: redis.Redis,
    job: str,
    output: str,
    key: str,
    *,
    start_from: int | None = None,
    start_before: int | None = None,
    final_only: bool = False,
) -> list[Window]:
    """``key``'s windows (key as JSON text) whose start is in [start_from, start_before),
    oldest first."""
    fields = client.hgetall(redis_prefix(job, output) + "w:" + key)
    found = [
        _window(key, int(_text(start)), _text(value))
        for start, value in fields.items()
        if _within(int(_text(start)), start_from, start_before)
    ]
    return sorted((w for w in found if w.final or not final_only), key=lambda w: w.start)


def _within(start: int, start_from: int | None, start_before: int | None) -> bool:
    return (start_from is None or start >= start_from) and (
        start_before is None or start < start_before
    )


def _window(key: str, start: int, text: str) -> Window:
    held = json.loads(text)
    return Window(
        key=json.loads(key),
        start=start,
        end=int(held["end"]),
        values=held["values"],
        version=int(held["version"]),
        final=bool(held["final"]),
    )


def _per_key(
    client: redis.Redis, job: str, output: str, read: Callable[[Pipeline, str], object]
) -> Iterable[tuple[str, Any]]:
    """Each key of the output (JSON text) with what ``read`` asks of its windows' hash,
    ``_BATCH`` keys a round trip."""
    prefix = redis_prefix(job, output) + "w:"
    names = keys(client, job, output)
    for low in range(0, len(names), _BATCH):
        chunk = names[low : low + _BATCH]
        pipe = client.pipeline(transaction=False)
        for key in chunk:
            read(pipe, prefix + key)
        yield from zip(chunk, pipe.execute(), strict=True)


def _every_window(client: redis.Redis, job: str, output: str) -> Iterable[Window]:
    for key, fields in _per_key(client, job, output, lambda pipe, name: pipe.hgetall(name)):
        for start, value in fields.items():
            yield _window(key, int(_text(start)), _text(value))


def latest_windows(
    client: redis.Redis, job: str, output: str, *, limit: int, final_only: bool = False
) -> list[Window]:
    """The ``limit`` windows with the latest starts across every key (newest first; at
    one start, by key)."""
    found = [w for w in _every_window(client, job, output) if w.final or not final_only]
    found.sort(key=lambda w: (-w.start, json.dumps(w.key)))
    return found[:limit]


def top_keys(
    client: redis.Redis, job: str, output: str, start: int, *, field: str, limit: int
) -> list[Window]:
    """The window starting at ``start`` of the ``limit`` keys with the largest
    ``values[field]`` (ties by key); ApiBadRequestError when the window's values have
    no such number."""
    field_name = str(start)
    found = [
        _window(key, start, _text(value))
        for key, value in _per_key(
            client, job, output, lambda pipe, name: pipe.hget(name, field_name)
        )
        if value is not None
    ]
    ranked = [w for w in found if isinstance(w.values.get(field), int | float)]
    if found and not ranked:
        numeric = sorted(
            {k for w in found for k, v in w.values.items() if isinstance(v, int | float)}
        )
        raise ApiBadRequestError(
            f"the window's values have no number {field!r} to rank by "
            f"(they have: {', '.join(numeric) or 'none'})"
        )
    ranked.sort(key=lambda w: (-float(w.values[field]), json.dumps(w.key)))
    return ranked[:limit]


def latest_records(
    client: redis.Redis,
    job: str,
    output: str,
    *,
    after: str | None,
    limit: int,
    has: str | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """A keyed output's latest record per key, by key (JSON text) after ``after``, only
    those whose field ``has`` is set (true, non-zero, non-empty) when given; and the key
    to page on from, or None at the end."""
    held = client.hgetall(redis_prefix(job, output) + "latest")
    ordered = sorted((_text(k), json.loads(_text(v))) for k, v in held.items())
    if after is not None:
        ordered = [(k, v) for k, v in ordered if k > after]
    if has is not None:
        ordered = [(k, v) for k, v in ordered if isinstance(v, dict) and v.get(has)]
    page = ordered[:limit]
    more = len(ordered) > limit
    rows = [{"key": json.loads(k), "record": v} for k, v in page]
    return rows, (page[-1][0] if more and page else None)
