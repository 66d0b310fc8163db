"""
Server RSS under hostile clients: before, during and after (the figures of
docs/reliability.md, "Hostile clients and memory bounds").

Scenarios, each against a fresh server process on 127.0.0.1:

- ``sets``: 16 memcache connections each declare a 64 MiB ``set`` and send
  63 MiB of it, never finishing; then they close.
- ``lines``: 4 text connections each send a 63 MiB line with no end.
- ``readers``: 5 clients per protocol (memcache, text) pipeline 60 peeks of a
  1 MiB item and never read the replies; then they close.

Prints one line per scenario: RSS before, during, after (MB), and server CPU.
This is not a test. ``python benchmarks/hostile_memory.py --help``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from servers import cpu_seconds  # noqa: E402

from tests.wire.conftest import KestrelProcess  # noqa: E402
from tests.wire.hostile import (  # noqa: E402
    MiB,
    close_all,
    declared_set,
    long_line,
    non_readers,
    run_senders,
    settled_rss,
)

SCENARIOS = ("sets", "lines", "readers")


def scenario(name: str, server: KestrelProcess) -> dict[str, Any]:
    """Run scenario C{name} against C{server}; return its figures."""
    assert server.proc is not None
    pid = server.proc.pid
    item = b"y" * MiB
    if name == "readers":
        client = server.connect("memcache")
        client.sendall(b"set one 0 0 %d\r\n%s\r\n" % (len(item), item))
        assert client.recv(100) == b"STORED\r\n"
        client.close()
    before = settled_rss(pid, 0.5)
    cpu0 = cpu_seconds(pid)
    peak = before
    outcomes: list[str] = []
    if name == "sets":
        sockets, outcomes = run_senders(lambda: server.connect("memcache", 120),
                                        [declared_set(64 * MiB, 63 * MiB, b"big%d" % i)
                                         for i in range(16)])
    elif name == "lines":
        sockets, outcomes = run_senders(lambda: server.connect("text", 120),
                                        [long_line(63 * MiB) for _ in range(4)])
    else:
        sockets = non_readers(lambda: server.connect("memcache"), b"get one/peek\r\n", 60, 5)
        sockets += non_readers(lambda: server.connect("text"), b"peek one\n", 60, 5)
        time.sleep(2.0)
    during = settled_rss(pid, 0.5)
    peak = max(peak, during)
    close_all(sockets)
    after = settled_rss(pid, 1.0)
    return {"scenario": name, "before_mb": before / 1e6, "during_mb": during / 1e6,
            "after_mb": after / 1e6, "cpu_s": cpu_seconds(pid) - cpu0,
            "refused": outcomes.count("refused"), "connections": len(outcomes) or 10,
            "load": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="*", default=list(SCENARIOS),
                        help=f"any of {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra server config, e.g. --set max_client_memory=128MiB")
    args = parser.parse_args(argv)
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    extra = dict(item.split("=", 1) for item in args.set)
    for name in args.scenarios:
        with tempfile.TemporaryDirectory() as folder:
            server = KestrelProcess(Path(folder), ("memcache", "text"), extra)
            server.start()
            try:
                r = scenario(name, server)
            finally:
                server.stop()
        print(f"{r['scenario']:8s} RSS before {r['before_mb']:7.1f} MB  during "
              f"{r['during_mb']:7.1f} MB  after {r['after_mb']:7.1f} MB  refused "
              f"{r['refused']}/{r['connections']}  server CPU {r['cpu_s']:.2f} s  "
              f"load {r['load']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
