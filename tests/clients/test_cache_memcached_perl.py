"""Perl's Cache::Memcached (Debian's libcache-memcached-perl) against a real server."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clients.driver import HERE, DriverAdapter, require
from tests.clients.matrix import operation_params, run_operation
from tests.wire.conftest import KestrelProcess


class CacheMemcachedPerlAdapter(DriverAdapter):
    """C{Cache::Memcached->new} with C{select_timeout} longer than every /t=."""

    name = "Perl Cache::Memcached"
    unsupported = {"version": "no version call (stats() shows the server's version)"}
    version = None

    def argv(self, workdir: Path) -> list[str]:
        perl = require("perl", "perl")
        probe = subprocess.run([perl, "-MCache::Memcached", "-e", "1"], capture_output=True,
                               check=False)
        if probe.returncode != 0:
            pytest.skip("Cache::Memcached is not installed (Debian package "
                        "libcache-memcached-perl)")
        return [perl, str(HERE / "perl" / "driver.pl")]


@pytest.fixture(scope="module")
def client(server: KestrelProcess, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[CacheMemcachedPerlAdapter]:
    adapter = CacheMemcachedPerlAdapter([server], tmp_path_factory.mktemp("perl"))
    yield adapter
    adapter.shutdown()


@pytest.mark.parametrize("op", operation_params(CacheMemcachedPerlAdapter))
def test_cache_memcached(client: CacheMemcachedPerlAdapter, op: str) -> None:
    """Each matrix operation through Cache::Memcached, checked on the server's counters."""
    run_operation(client, op, "perl")
