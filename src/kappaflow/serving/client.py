"""A Redis client for the configured serving store, with errors turned into ours."""

from __future__ import annotations

import redis

from kappaflow.errors import RedisUnreachableError
from kappaflow.settings import Settings


def redis_client(settings: Settings) -> redis.Redis:
    """A connected client; a ServiceError with the fix if Redis does not answer."""
    client = redis.Redis.from_url(settings.redis.effective_url, socket_timeout=30)
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
