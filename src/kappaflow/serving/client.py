"""A Redis client for the configured serving store, with errors turned into ours."""

from __future__ import annotations

import redis

from kappaflow.errors import RedisUnreachableError
from kappaflow.settings import Settings


def redis_client(settings: Settings) -> redis.Redis:
    """A connected client; a ServiceError with the fix if Redis does not answer."""
    client = redis.Redis.from_url(
        settings.redis.effective_url,
        socket_timeout=30,
        username=settings.redis.username,
        password=settings.redis.secret,
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        hint = (
            "start it with `kappaflow redis start` (or `kappaflow up`)"
            if settings.redis.embedded
            else "check redis.url"
        )
        raise RedisUnreachableError(
            f"cannot reach Redis at {settings.redis.effective_url} ({exc}): {hint}"
        ) from None
    return client


def drop_job_keys(client: redis.Redis, job: str) -> int:
    """Delete every key of job ``job`` (``kf:JOB:*``) and say how many there were.

    Keys are found with SCAN and unlinked a thousand at a time: Redis frees their memory
    in the background, and serves others between the calls."""
    dropped = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=f"kf:{job}:*", count=1000):
        batch.append(key)
        if len(batch) == 1000:
            dropped += int(client.unlink(*batch))
            batch.clear()
    if batch:
        dropped += int(client.unlink(*batch))
    return dropped


def redis_prefix(job: str, output: str) -> str:
    """The prefix of an output's keys in the serving store."""
    return f"kf:{job}:{output}:"
