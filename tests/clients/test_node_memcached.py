"""
node's `memcached` (npm, pinned in tests/clients/node/package-lock.json;
text protocol) against a real server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clients.driver import HERE, DriverAdapter, require, require_file
from tests.clients.matrix import operation_params, run_operation
from tests.wire.conftest import KestrelProcess

#: The npm step of the README's test command installs the node clients here.
NODE_MODULES = HERE / "node" / "node_modules"
NPM_STEP = "npm ci --prefix tests/clients/node"


def node_driver(script: str, package: str) -> list[str]:
    """The command line of a node driver, or skip when node or the npm package is missing."""
    node = require("node", "nodejs")
    require_file(NODE_MODULES / package / "package.json", f"{package} with `{NPM_STEP}`")
    return [node, str(HERE / "node" / script)]


class NodeMemcachedAdapter(DriverAdapter):
    """
    C{new Memcached(server, {poolSize: 1, idle: 60000, timeout: 10000})}:
    one connection, never dropped while a blocking read waits.
    """

    name = "node `memcached`"
    unsupported = {"flush": "no way to send a command the client does not know"}
    flush = None

    def argv(self, workdir: Path) -> list[str]:
        return node_driver("memcached-driver.js", "memcached")


@pytest.fixture(scope="module")
def client(server: KestrelProcess, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[NodeMemcachedAdapter]:
    adapter = NodeMemcachedAdapter([server], tmp_path_factory.mktemp("node"))
    yield adapter
    adapter.shutdown()


@pytest.mark.parametrize("op", operation_params(NodeMemcachedAdapter))
def test_node_memcached(client: NodeMemcachedAdapter, op: str) -> None:
    """Each matrix operation through node `memcached`, checked on the server's counters."""
    run_operation(client, op, "nodemc")
