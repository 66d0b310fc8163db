"""
pymemcache against a real server: C{Client}, and C{HashClient} over three
servers with queue names chosen so that every key of a queue (C{q},
C{q/open}, C{q/t=...}, ...) hashes to the same server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from pymemcache.client.base import Client
from pymemcache.client.hash import HashClient

from tests.clients.matrix import (
    LONG_WAIT_MS,
    SHORT_WAIT_MS,
    Adapter,
    MemcacheAdapter,
    counters,
    operation_params,
    run_operation,
    seed,
)
from tests.wire.conftest import KestrelProcess

#: Socket timeout (s): longer than the longest /t= wait, so a blocking get is never cut short.
TIMEOUT = 10.0


class PymemcacheAdapter(MemcacheAdapter):
    """pymemcache's C{Client}: noreply off, so that every set is acknowledged."""

    name = "pymemcache `Client`"
    unsupported = {}

    def __init__(self, servers: list[KestrelProcess]) -> None:
        super().__init__(servers)
        self.client = Client((servers[0].host, servers[0].memcache_port),
                             default_noreply=False, timeout=TIMEOUT, connect_timeout=TIMEOUT)

    def fetch(self, key: str) -> bytes | None:
        return self.client.get(key)

    def set(self, queue: str, data: bytes) -> None:
        assert self.client.set(queue, data) is True

    def stats(self, queue: str) -> int:
        return self.client.stats()[f"queue_{queue}_items".encode()]

    def delete(self, queue: str) -> None:
        assert self.client.delete(queue) is True

    def flush(self, queue: str) -> None:
        assert self.client.raw_command(f"flush {queue}", b"END\r\n") == b""

    def flush_all(self) -> None:
        assert self.client.flush_all() is True

    def version(self) -> str:
        return self.client.version().decode()

    def shutdown(self) -> None:
        self.client.close()


#: Every key a scenario sends for queue C{q}.
OPTION_SUFFIXES = ("", "/open", "/close", "/close/open", "/abort", "/peek",
                   f"/t={SHORT_WAIT_MS}", f"/t={LONG_WAIT_MS}")


class HashClientAdapter(PymemcacheAdapter):
    """pymemcache's C{HashClient} over three servers; each queue lives on one of them."""

    name = "pymemcache `HashClient` (3 servers)"
    unsupported = {
        "flush": "HashClient has no raw_command(); use a Client for the server that holds the "
                 "queue",
        "stats": "HashClient has no stats(); use a Client per server",
        "version": "HashClient has no version(); use a Client per server",
    }
    stats = None
    flush = None
    version = None

    def __init__(self, servers: list[KestrelProcess]) -> None:
        Adapter.__init__(self, servers)
        self.by_node = {f"{s.host}:{s.memcache_port}": s for s in servers}
        self.client = HashClient([(s.host, s.memcache_port) for s in servers],
                                 default_noreply=False, timeout=TIMEOUT,
                                 connect_timeout=TIMEOUT, use_pooling=False)

    def node(self, key: str) -> str:
        """The server (C{host:port}) HashClient sends C{key} to."""
        return self.client.hasher.get_node(key)

    def queue_name(self, base: str) -> str:
        # All 8 keys of a name land on one of 3 servers about once in 3**7 = 2,187
        # names; 200,000 tries make a miss practically impossible for any ports.
        for i in range(200_000):
            queue = f"{base}{i}"
            node = self.node(queue)
            if all(self.node(queue + suffix) == node for suffix in OPTION_SUFFIXES[1:]):
                return queue
        raise AssertionError(f"no queue name {base}<n> whose keys all hash to one server")

    def server_for(self, queue: str) -> KestrelProcess:
        return self.by_node[self.node(queue)]

    def flush_all(self) -> None:
        self.client.flush_all()


@pytest.fixture(scope="module")
def pymemcache_client(server: KestrelProcess) -> Iterator[PymemcacheAdapter]:
    adapter = PymemcacheAdapter([server])
    yield adapter
    adapter.shutdown()


@pytest.fixture(scope="module")
def hash_client(start_servers: Callable[..., list[KestrelProcess]]
                ) -> Iterator[HashClientAdapter]:
    adapter = HashClientAdapter(start_servers(3))
    yield adapter
    adapter.shutdown()


@pytest.mark.parametrize("op", operation_params(PymemcacheAdapter))
def test_client(pymemcache_client: PymemcacheAdapter, op: str) -> None:
    """Each matrix operation through pymemcache's Client, checked on the server's counters."""
    run_operation(pymemcache_client, op, "pym")


@pytest.mark.parametrize("op", operation_params(HashClientAdapter))
def test_hash_client(hash_client: HashClientAdapter, op: str) -> None:
    """Each matrix operation through HashClient, on the server that holds the queue."""
    run_operation(hash_client, op, "hash")


def test_hash_client_keeps_each_queue_on_one_server(hash_client: HashClientAdapter) -> None:
    """
    The chosen names spread over the servers, and a queue's items and open
    reads live on its server only: the others never see the queue.
    """
    queues = [hash_client.queue_name(f"spread{i}_") for i in range(12)]
    assert len({hash_client.node(q) for q in queues}) > 1
    for queue in queues[:3]:
        home = hash_client.server_for(queue)
        hash_client.set(queue, b"x")
        assert hash_client.open(queue) == b"x"
        assert counters(home, queue) == (0, 1)
        hash_client.close(queue)
        seed(home, queue, b"y")
        assert hash_client.peek(queue) == b"y"
        for other in hash_client.servers:
            if other is not home:
                assert counters(other, queue) is None
