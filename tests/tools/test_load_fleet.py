"""kestrel-load fleet: producers and reliable consumers through the fleet client, real servers."""

from __future__ import annotations

import io
import re
from collections.abc import Callable

import pytest

from kestrel.tools import load
from tests.wire.conftest import KestrelProcess

LATENCY = r"latency in usec: count=\d+ min=\d+ p50=\d+ p90=\d+ p99=\d+ p999=\d+ max=\d+"


def test_fleet_over_a_static_list(kestrel_factory: Callable[..., KestrelProcess]) -> None:
    servers = [kestrel_factory() for _ in range(2)]
    out = io.StringIO()
    status = load.main(["fleet", "--servers", ",".join(s.address() for s in servers),
                        "-n", "400", "-b", "100", "-q", "fleetq", "-R", "2", "-C", "3",
                        "-r", "4"], out)
    lines = out.getvalue().splitlines()
    assert status == 0, lines
    assert re.fullmatch(r"Finished in \d+ msec \([\d.]+ usec/item throughput\)\.",
                        next(line for line in lines if line.startswith("Finished")))
    puts = next(line for line in lines if line.startswith("puts per server: "))
    counts = {part.split("=")[0]: int(part.split("=")[1]) for part in puts.split()[3:]}
    assert set(counts) == {s.address() for s in servers} and sum(counts.values()) == 400
    for label in ("put", "read", "confirm"):
        assert any(re.fullmatch(f"{label} {LATENCY}", line) for line in lines), label


def test_fleet_needs_exactly_one_source(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        load.main(["fleet", "--servers", "a:1", "--zookeeper", "zk:2181/k"])
    assert info.value.code == 1
    with pytest.raises(SystemExit):
        load.main(["fleet"])
    assert "one of the arguments --servers --zookeeper is required" in capsys.readouterr().err


def test_fleet_reports_an_unreachable_fleet(kestrel_factory: Callable[..., KestrelProcess]
                                            ) -> None:
    server = kestrel_factory(start=False)
    out = io.StringIO()
    status = load.main(["fleet", "--servers", server.address(), "-n", "5", "-t", "3",
                        "--progress", "60"], out)
    assert status == 1
    assert "put failed" in out.getvalue() and "connection refused" in out.getvalue().lower()
