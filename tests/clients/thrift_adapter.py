"""The matrix's operations over Kestrel's thrift service, for any generated client."""

from __future__ import annotations

from collections import deque
from typing import Any

from tests.clients.matrix import Adapter
from tests.wire.conftest import KestrelProcess

#: How long an open read stays open before the server aborts it (ms): longer than a test.
AUTO_ABORT_MS = 120_000


class ThriftAdapter(Adapter):
    """
    A thrift client of the C{Kestrel} service. Open reads are C{get}s with
    C{auto_abort_msec}; their ids are kept per queue so that C{close}
    confirms and C{abort} aborts the oldest, as memcache's /close and /abort do.
    """

    protocol = "thrift"
    unsupported = {}

    def __init__(self, servers: list[KestrelProcess], client: Any) -> None:
        super().__init__(servers)
        self.client = client
        self.open_ids: dict[str, deque[int]] = {}

    def fetch(self, queue: str, timeout_ms: int = 0, auto_abort_ms: int = 0) -> Any:
        items = self.client.get(queue, 1, timeout_ms, auto_abort_ms)
        assert len(items) <= 1
        return items[0] if items else None

    def set(self, queue: str, data: bytes) -> None:
        assert self.client.put(queue, [data], 0) == 1

    def get(self, queue: str) -> bytes | None:
        item = self.fetch(queue)
        return None if item is None else item.data

    def open(self, queue: str) -> bytes | None:
        item = self.fetch(queue, 0, AUTO_ABORT_MS)
        if item is None:
            return None
        assert item.id > 0
        self.open_ids.setdefault(queue, deque()).append(item.id)
        return item.data

    def close(self, queue: str) -> None:
        assert self.client.confirm(queue, {self.open_ids[queue].popleft()}) == 1

    def close_open(self, queue: str) -> bytes | None:
        self.close(queue)
        return self.open(queue)

    def abort(self, queue: str) -> None:
        assert self.client.abort(queue, {self.open_ids[queue].popleft()}) == 1

    def peek(self, queue: str) -> bytes | None:
        return self.client.peek(queue).head_item

    def blocking_get(self, queue: str, timeout_ms: int) -> bytes | None:
        item = self.fetch(queue, timeout_ms)
        return None if item is None else item.data

    def stats(self, queue: str) -> int:
        return self.client.peek(queue).items

    def delete(self, queue: str) -> None:
        self.client.delete_queue(queue)

    def flush(self, queue: str) -> None:
        self.client.flush_queue(queue)

    def flush_all(self) -> None:
        self.client.flush_all_queues()

    def version(self) -> str:
        return self.client.get_version()
