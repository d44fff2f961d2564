"""A Redis client that tries once, for tests that expect a refusal or a server gone: redis-py's
default client retries a refused connection (an ``AuthenticationError`` too) ten times with backoff,
about 4 s of waiting before the error the test expects."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry


def single_try(url: str | None = None, **kwargs: Any) -> redis.Redis:
    """A client of ``url`` (else of the ``host``/``port`` keywords) that never retries."""
    kwargs["retry"] = Retry(NoBackoff(), 0)
    return redis.Redis.from_url(url, **kwargs) if url else redis.Redis(**kwargs)
