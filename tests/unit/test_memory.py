"""
Memory savings that must not change behaviour (docs/performance.md, "Memory").

The thrift and admin modules (with thriftpy2, twisted.web and
prometheus_client) are imported only when their port is set, and still load
and serve when it is; items with equal add times share one int object, with
their values, equality and order unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.testing import MemoryReactorClock

from kestrel.config import DEFAULT_CONFIG, ServerConfig
from kestrel.errors import ConfigError
from kestrel.item import QItem
from kestrel.service import make_kestrel_service

ROOT = Path(__file__).resolve().parents[2]

#: The modules only the thrift and admin listeners need.
OPTIONAL = ("kestrel.protocols.thrift", "thriftpy2", "kestrel.admin", "twisted.web",
            "prometheus_client")

#: Builds and starts a server on a memory reactor in a fresh interpreter and
#: prints the listeners' factory classes and which OPTIONAL modules it loaded.
PROBE = """
import json, sys
import attrs
from twisted.internet.testing import MemoryReactorClock
from kestrel.config import DEFAULT_CONFIG
from kestrel.service import make_kestrel_service
config = attrs.evolve(DEFAULT_CONFIG, queue_path=sys.argv[1], status_file=sys.argv[2],
                      memcache_port=22133, text_port=2222, thrift_port=int(sys.argv[3]),
                      admin_port=int(sys.argv[4]))
reactor = MemoryReactorClock()
service = make_kestrel_service(config, reactor, install_signal_handlers=False)
service.startService()
print(json.dumps({
    "factories": [type(f).__name__ for _p, f, _b, _i in reactor.tcpServers],
    "loaded": sorted(m for m in sys.modules
                     if m.split(".")[0] in ("thriftpy2", "prometheus_client")
                     or m in ("kestrel.protocols.thrift", "kestrel.admin", "twisted.web")),
}))
service.stopService()
"""


def probe(tmp_path: Path, thrift_port: int, admin_port: int) -> dict[str, Any]:
    """Run L{PROBE} with the given ports in a fresh interpreter; return what it printed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "queues"), str(tmp_path / "status"),
         str(thrift_port), str(admin_port)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_thrift_and_admin_modules_not_loaded_without_their_ports(tmp_path: Path) -> None:
    """With thrift_port and admin_port 0, a started server never imports their modules."""
    got = probe(tmp_path, 0, 0)
    assert got["factories"] == ["MemcacheFactory", "TextFactory"]
    assert got["loaded"] == []


def test_thrift_and_admin_modules_load_with_their_ports(tmp_path: Path) -> None:
    """With their ports set, the thrift and admin listeners are built from their modules."""
    got = probe(tmp_path, 2229, 2223)
    assert got["factories"] == ["MemcacheFactory", "TextFactory", "ThriftFactory", "AdminSite"]
    assert {"kestrel.protocols.thrift", "thriftpy2", "kestrel.admin", "twisted.web",
            "prometheus_client"} <= set(got["loaded"])


def test_admin_token_problem_still_stops_the_build(tmp_path: Path) -> None:
    """The admin site is still made (and its token read) when the service is built."""
    config: ServerConfig = attrs.evolve(
        DEFAULT_CONFIG, queue_path=str(tmp_path / "queues"),
        status_file=str(tmp_path / "status"), admin_port=2223,
        admin_token_file=str(tmp_path / "missing-token"))
    with pytest.raises(ConfigError, match="missing-token"):
        make_kestrel_service(config, MemoryReactorClock(), install_signal_handlers=False)


def test_equal_add_times_share_one_int() -> None:
    """Consecutive items with equal add times hold the same int object; others their own."""
    base = 1_795_000_000_000
    first = QItem(b"a", base + int("0"))
    second = QItem(b"b", base + int("0"))
    third = QItem(b"c", base + int("1"))
    assert first.add_time_ms is second.add_time_ms
    assert third.add_time_ms == base + 1
    assert third.add_time_ms is not first.add_time_ms


def test_non_int_add_time_is_not_shared() -> None:
    """An add time that is not an int is kept as given and never handed to a later item."""
    base = 1_795_000_000_002
    odd = QItem(b"a", float(base))
    after = QItem(b"b", base + int("0"))
    assert type(odd.add_time_ms) is float
    assert type(after.add_time_ms) is int and after.add_time_ms == base


@given(st.lists(st.tuples(st.binary(max_size=8), st.integers(0, 2**63 - 1),
                          st.integers(0, 2**63 - 1), st.integers(0, 2**31 - 1)),
                max_size=30))
def test_items_keep_their_values(fields: list[tuple[bytes, int, int, int]]) -> None:
    """Whatever came before, an item holds exactly the values it was made with."""
    items = [QItem(*f) for f in fields]
    for item, (data, add_time_ms, expiry_ms, xid) in zip(items, fields, strict=True):
        assert (item.data, item.add_time_ms, item.expiry_ms, item.xid) == (
            data, add_time_ms, expiry_ms, xid)
        assert type(item.add_time_ms) is int
        assert item == QItem(data, add_time_ms, expiry_ms, xid)
        assert repr(item) == repr(QItem(data, add_time_ms, expiry_ms, xid))

