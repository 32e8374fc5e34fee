"""YSB's Redis layout: the ad-to-campaign table, the windows, and reading them back.

The keys are the original's, unprefixed, so they live in a Redis database of their own
(``YSB_DB``); the benchmark's setup empties that database, as the original's ``-n``
empties the whole server, and nothing else of kappaflow is touched.

```
campaigns             SET     the 100 campaign ids
<ad_id>               STRING  its campaign id
<campaign_id>         HASH    "<window start ms>" -> <window id>, "windows" -> <list id>
<list id>             LIST    window starts, newest first
<window id>           HASH    seen_count, time_updated (epoch ms of the writer's clock)
```

Two differences from the original writer, neither visible to the latency method:
window ids are UUIDs derived from (campaign, window) rather than random, and a writer
either sets ``seen_count`` to a running count or increments it by a batch's count
under a batch-id fence (``kappaflow:fences``). Both make a repeated write (a
micro-batch replayed after a crash) harmless.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import redis

from kappaflow.errors import ServiceError
from kappaflow_bench.ysb.workload import ADS_PER_CAMPAIGN, CAMPAIGNS

YSB_DB = 1
#: Hash of writer -> last batch id applied (a hash, so the ad table's scan skips it).
FENCES = "kappaflow:fences"
_IDS = uuid.UUID("5f0c3d52-41b7-4c1e-9b38-3f2f6f0b9a11")


def connect(url: str, db: int = YSB_DB) -> redis.Redis:
    """A client on the YSB database of the Redis at ``url``, whatever database the URL
    names (``from_url(url, db=...)`` would let a ``/0`` in the URL win)."""
    pool = redis.ConnectionPool.from_url(url, socket_timeout=30)
    options = {**pool.connection_kwargs, "db": db}
    client = redis.Redis(
        connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **options)
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        raise ServiceError(f"cannot reach Redis at {url} ({exc})") from None
    return client


def new_setup(store: redis.Redis, rng: random.Random) -> list[str]:
    """The original's ``-n``: an empty database and 100 new campaigns."""
    store.flushdb()
    campaigns = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(CAMPAIGNS)]
    store.sadd("campaigns", *campaigns)
    return campaigns


def new_ads(store: redis.Redis, rng: random.Random) -> list[str]:
    """The original's ``-r`` start: 1000 new ads, 10 per campaign, ``SET ad campaign``."""
    campaigns = sorted(m.decode() for m in store.smembers("campaigns"))  # type: ignore[union-attr]
    if len(campaigns) != CAMPAIGNS:
        raise ServiceError(f"Redis holds {len(campaigns)} YSB campaigns, not {CAMPAIGNS}")
    ads = [
        str(uuid.UUID(int=rng.getrandbits(128), version=4))
        for _ in range(CAMPAIGNS * ADS_PER_CAMPAIGN)
    ]
    pipe = store.pipeline(transaction=False)
    for n, ad in enumerate(ads):
        pipe.set(ad, campaigns[n // ADS_PER_CAMPAIGN])
    pipe.execute()
    return ads


def ad_campaigns(store: redis.Redis) -> dict[str, str]:
    """The whole ad -> campaign table: every string key of the YSB database is an ad."""
    ads = [_text(key) for key in store.scan_iter(count=10_000, _type="string")]
    table: dict[str, str] = {}
    for start in range(0, len(ads), 5_000):
        chunk = ads[start : start + 5_000]
        values: list[bytes | None] = store.mget(chunk)  # type: ignore[assignment]
        for ad, campaign in zip(chunk, values, strict=True):
            if campaign is not None:
                table[ad] = _text(campaign)
    return table


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def window_id(campaign: str, window_start_ms: int) -> str:
    return str(uuid.uuid5(_IDS, f"{campaign}/{window_start_ms}"))


def windows_list_id(campaign: str) -> str:
    return str(uuid.uuid5(_IDS, f"{campaign}/windows"))


class WindowWriter:
    """Writes window counts in the original layout, one pipelined round trip a call
    (two when a window is new)."""

    def __init__(self, store: redis.Redis) -> None:
        self.store = store
        self._known: set[tuple[str, int]] = set()

    def write(self, counts: Iterable[tuple[str, int, int]], now_ms: int) -> int:
        """``counts``: (campaign, window start ms, count). Returns how many were written."""
        rows = list(counts)
        new = [(c, w) for c, w, _ in rows if (c, w) not in self._known]
        if new:
            self._create(new)
        pipe = self.store.pipeline(transaction=False)
        for campaign, start, count in rows:
            pipe.hset(
                window_id(campaign, start), mapping={"seen_count": count, "time_updated": now_ms}
            )
        pipe.execute()
        return len(rows)

    def add(
        self, deltas: Iterable[tuple[str, int, int]], now_ms: int, *, fence: tuple[str, int]
    ) -> bool:
        """Add ``deltas`` (campaign, window start ms, views) to the windows' counts, once.

        ``fence`` is (writer, batch id): a batch id not above the last one this writer
        applied is skipped, and the counts and the new fence are applied in one
        MULTI/EXEC, so a batch is added exactly once even when it is retried.
        Returns False if the batch was already applied.
        """
        writer, batch_id = fence
        done = self.store.hget(FENCES, writer)
        if done is not None and int(done) >= batch_id:
            return False
        rows = list(deltas)
        new = [(c, w) for c, w, _ in rows if (c, w) not in self._known]
        if new:
            self._create(new)
        pipe = self.store.pipeline(transaction=True)
        for campaign, start, count in rows:
            wid = window_id(campaign, start)
            pipe.hincrby(wid, "seen_count", count)
            pipe.hset(wid, "time_updated", now_ms)
        pipe.hset(FENCES, writer, batch_id)
        pipe.execute()
        return True

    def _create(self, windows: Sequence[tuple[str, int]]) -> None:
        pipe = self.store.pipeline(transaction=False)
        for campaign, start in windows:
            pipe.hsetnx(campaign, str(start), window_id(campaign, start))
            pipe.hsetnx(campaign, "windows", windows_list_id(campaign))
        created = pipe.execute()[0::2]
        pipe = self.store.pipeline(transaction=False)
        for (campaign, start), fresh in zip(windows, created, strict=True):
            if fresh:
                pipe.lpush(windows_list_id(campaign), str(start))
        pipe.execute()
        self._known.update(windows)


@dataclass(frozen=True)
class WindowStat:
    campaign: str
    window_start: int
    seen_count: int
    time_updated: int

    @property
    def updated(self) -> int:
        """The original's ``updated.txt`` value: time_updated minus the window's start."""
        return self.time_updated - self.window_start


def get_stats(store: redis.Redis) -> list[WindowStat]:
    """The original's ``-g``: every window of every campaign, as the layout holds it.

    Walks campaigns -> windows list -> window hash exactly as the original reader does,
    so a window missing from any link of that chain is missing here too.
    """
    campaigns = sorted(m.decode() for m in store.smembers("campaigns"))  # type: ignore[union-attr]
    pipe = store.pipeline(transaction=False)
    for campaign in campaigns:
        pipe.hget(campaign, "windows")
    lists = pipe.execute()
    pipe = store.pipeline(transaction=False)
    for key in lists:
        pipe.lrange(key or b"-", 0, -1)
    starts = pipe.execute()
    pairs = [
        (campaign, int(start))
        for campaign, window_starts in zip(campaigns, starts, strict=True)
        for start in window_starts
    ]
    pipe = store.pipeline(transaction=False)
    for campaign, start in pairs:
        pipe.hget(campaign, str(start))
    ids = pipe.execute()
    pipe = store.pipeline(transaction=False)
    for wid in ids:
        pipe.hmget(wid or b"-", ["seen_count", "time_updated"])
    values = pipe.execute()
    stats = []
    for (campaign, start), (seen, updated) in zip(pairs, values, strict=True):
        if seen is not None and updated is not None:
            stats.append(WindowStat(campaign, start, int(seen), int(updated)))
    return stats


def job_windows(client: redis.Redis, job: str, output: str) -> dict[tuple[str, int], int]:
    """The counts a job on the job API holds in the serving store: (campaign, window
    start ms) -> ``seen_count``, read from its layout (``kf:JOB:OUTPUT:keys``, the set of
    key JSON arrays, and per key the hash ``kf:JOB:OUTPUT:w:KEY`` of window start ->
    ``{"end", "values": {"seen_count"}, "version", "final"}``)."""
    prefix = f"kf:{job}:{output}:"
    keys = sorted(_text(k) for k in client.smembers(prefix + "keys"))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hgetall(prefix + "w:" + key)
    found: dict[tuple[str, int], int] = {}
    for key, windows in zip(keys, pipe.execute(), strict=True):
        (campaign,) = json.loads(key)
        for start, held in windows.items():
            values = json.loads(held)["values"]
            if values is not None:
                found[(str(campaign), int(start))] = int(values["seen_count"])
    return found
