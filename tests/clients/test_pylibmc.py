"""pylibmc (libmemcached) against a real server, operation by operation."""

from __future__ import annotations

from collections.abc import Iterator

import pylibmc
import pytest

from tests.clients.matrix import LibraryClientAdapter, operation_params, run_operation
from tests.wire.conftest import KestrelProcess

#: libmemcached's timeouts, longer than every /t= wait (poll and connect in ms,
#: send and receive in microseconds).
BEHAVIORS = {"_poll_timeout": 10_000, "connect_timeout": 10_000,
             "receive_timeout": 10_000_000, "send_timeout": 10_000_000}


class PylibmcAdapter(LibraryClientAdapter):
    """pylibmc's C{Client}, text protocol, with timeouts longer than every /t=."""

    name = "pylibmc"
    #: Whether the client speaks memcache's binary protocol (else the text one).
    binary = False
    unsupported = {
        "flush": "no way to send a command the client does not know",
        "version": "no version call (get_stats() shows the server's version)",
        "stats": "get_stats() keeps only libmemcached's fixed set of memcached stats "
                 "(curr_items, ...), not the per-queue ones",
    }
    flush = None
    version = None
    stats = None

    def __init__(self, servers: list[KestrelProcess]) -> None:
        super().__init__(servers)
        self.client = pylibmc.Client([servers[0].address()], binary=self.binary,
                                     behaviors=BEHAVIORS)


@pytest.fixture(scope="module")
def client(server: KestrelProcess) -> Iterator[PylibmcAdapter]:
    adapter = PylibmcAdapter([server])
    yield adapter
    adapter.shutdown()


@pytest.mark.parametrize("op", operation_params(PylibmcAdapter))
def test_pylibmc(client: PylibmcAdapter, op: str) -> None:
    """Each matrix operation through pylibmc, checked on the server's counters."""
    run_operation(client, op, "lmc")
