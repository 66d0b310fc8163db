"""Fixtures shared by the unit tests of the protocols."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from twisted.internet.task import Clock

from kestrel.protocols.memcache import MemcacheFactory
from kestrel.server import KestrelServer
from tests.support import StringClient, make_server


@pytest.fixture
def server(request: pytest.FixtureRequest, clock: Clock,
           tmp_path: Path) -> Iterator[KestrelServer]:
    """
    A started server on C{clock} with its queue folder under C{tmp_path}; stopped afterwards.

    A test module's C{SERVER_OPTIONS} dict, if it has one, is passed to make_server.
    """
    s = make_server(clock, tmp_path, **getattr(request.module, "SERVER_OPTIONS", {}))
    yield s
    s.collection.stopService()


@pytest.fixture
def factory(server: KestrelServer) -> MemcacheFactory:
    """A memcache factory over the unit tests' L{server}."""
    return MemcacheFactory(server)


@pytest.fixture
def conn(factory: MemcacheFactory) -> StringClient:
    """A memcache connection of L{factory}, in memory (see L{StringClient})."""
    return StringClient(factory)
