"""Ruby's Dalli 3.0 (Debian's ruby-dalli; binary protocol) against a real server."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clients.driver import HERE, DriverAdapter, require
from tests.clients.matrix import operation_params, run_operation
from tests.wire.conftest import KestrelProcess


class DalliAdapter(DriverAdapter):
    """C{Dalli::Client} with C{socket_timeout} longer than every /t=, items set C{raw: true}."""

    name = "Ruby Dalli 3.0 (binary protocol)"
    unsupported = {"flush": "no way to send a command the client does not know"}
    flush = None

    def argv(self, workdir: Path) -> list[str]:
        ruby = require("ruby", "ruby")
        probe = subprocess.run([ruby, "-e", "require 'dalli'"], capture_output=True,
                               check=False)
        if probe.returncode != 0:
            pytest.skip("Dalli is not installed (Debian package ruby-dalli)")
        return [ruby, str(HERE / "ruby" / "driver.rb")]


@pytest.fixture(scope="module")
def client(server: KestrelProcess, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[DalliAdapter]:
    adapter = DalliAdapter([server], tmp_path_factory.mktemp("ruby"))
    yield adapter
    adapter.shutdown()


@pytest.mark.parametrize("op", operation_params(DalliAdapter))
def test_dalli(client: DalliAdapter, op: str) -> None:
    """Each matrix operation through Dalli, checked on the server's counters."""
    run_operation(client, op, "dalli")
