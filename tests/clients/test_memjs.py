"""
node's memjs (npm, pinned in tests/clients/node/package-lock.json; binary
protocol) against a real server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clients.driver import DriverAdapter
from tests.clients.matrix import operation_params, run_operation
from tests.clients.test_node_memcached import node_driver
from tests.wire.conftest import KestrelProcess


class MemjsAdapter(DriverAdapter):
    """C{memjs.Client.create(server, {timeout: 10, retries: 0})}."""

    name = "node memjs (binary protocol)"
    unsupported = {
        "flush": "no way to send a command the client does not know",
        "version": "no version call (stats() shows the server's version)",
    }
    flush = None
    version = None

    def argv(self, workdir: Path) -> list[str]:
        return node_driver("memjs-driver.js", "memjs")


@pytest.fixture(scope="module")
def client(server: KestrelProcess, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[MemjsAdapter]:
    adapter = MemjsAdapter([server], tmp_path_factory.mktemp("memjs"))
    yield adapter
    adapter.shutdown()


@pytest.mark.parametrize("op", operation_params(MemjsAdapter))
def test_memjs(client: MemjsAdapter, op: str) -> None:
    """Each matrix operation through memjs, checked on the server's counters."""
    run_operation(client, op, "memjs")
