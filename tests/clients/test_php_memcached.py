"""
php-memcached (Debian's php-memcached and php-cli, on libmemcached) against
a real server, on the text protocol and on the binary protocol.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clients.driver import HERE, DriverAdapter, require
from tests.clients.matrix import operation_params, run_operation
from tests.wire.conftest import KestrelProcess


class PhpMemcachedAdapter(DriverAdapter):
    """C{Memcached} on the text protocol, libmemcached's timeouts longer than every /t=."""

    name = "php-memcached"
    mode = "ascii"
    unsupported = {"flush": "no way to send a command the client does not know"}
    flush = None

    def argv(self, workdir: Path) -> list[str]:
        php = require("php", "php-cli")
        probe = subprocess.run([php, "-r", "exit(class_exists('Memcached') ? 0 : 1);"],
                               capture_output=True, check=False)
        if probe.returncode != 0:
            pytest.skip("PHP has no Memcached class (Debian package php-memcached)")
        return [php, str(HERE / "php" / "driver.php"), self.mode]


class PhpMemcachedBinaryAdapter(PhpMemcachedAdapter):
    """The same client with C{Memcached::OPT_BINARY_PROTOCOL} on."""

    name = "php-memcached (binary protocol)"
    mode = "binary"


@pytest.fixture(scope="module", params=[PhpMemcachedAdapter, PhpMemcachedBinaryAdapter],
                ids=["ascii", "binary"])
def client(request: pytest.FixtureRequest, server: KestrelProcess,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[PhpMemcachedAdapter]:
    adapter = request.param([server], tmp_path_factory.mktemp("php"))
    yield adapter
    adapter.shutdown()


@pytest.mark.parametrize("op", operation_params(PhpMemcachedAdapter))
def test_php_memcached(client: PhpMemcachedAdapter, op: str) -> None:
    """Each matrix operation through php-memcached, checked on the server's counters."""
    run_operation(client, op, f"php_{client.mode}")
